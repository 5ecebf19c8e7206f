"""Fixtures for NFS tests: a real catalog (SQLite), a real data path on 10
emulated zone-file drives, the NFS server in a thread; helpers in nfs4_support."""

from __future__ import annotations

import shutil

import pytest
from nfs4_support import MiB, Stack, add_export, drop_nfs4fs, start_server


@pytest.fixture
def stack(tmp_path):
    # small drives: every test formats ten of them (zone files are preallocated)
    s = Stack(tmp_path, drive_size=24 * MiB, zone_size=2 * MiB, fragment_size=64 * 1024)
    yield s
    s.close()
    shutil.rmtree(tmp_path / "drives", ignore_errors=True)


@pytest.fixture
def big_stack(tmp_path):
    s = Stack(tmp_path, drive_size=384 * MiB, zone_size=16 * MiB, fragment_size=1 * MiB)
    yield s
    s.close()
    shutil.rmtree(tmp_path / "drives", ignore_errors=True)  # 3.8 GB: not kept for pytest's history


@pytest.fixture
def server(stack):
    add_export(stack.catalog)
    srv = start_server(stack)
    yield srv
    srv.stop()


@pytest.fixture(autouse=True)
def _drop_nfs4fs():
    yield
    drop_nfs4fs()
