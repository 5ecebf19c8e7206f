"""Fixtures for NFS tests: a real catalog (SQLite), a real data path on 10
emulated zone-file drives, the NFS server in a thread; helpers in nfs4_support."""
from __future__ import annotations

import pytest

from nfs4_support import MiB, Stack, add_export, drop_nfs4fs, start_server


@pytest.fixture
def stack(tmp_path):
    s = Stack(tmp_path, drive_size=64 * MiB, zone_size=4 * MiB, fragment_size=64 * 1024)
    yield s
    s.close()


@pytest.fixture
def big_stack(tmp_path):
    s = Stack(tmp_path, drive_size=384 * MiB, zone_size=16 * MiB, fragment_size=1 * MiB)
    yield s
    s.close()


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
