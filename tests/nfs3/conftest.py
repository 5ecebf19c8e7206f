"""Fixtures for NFSv3 tests: a real catalog (SQLite), a real data path on 10
emulated zone-file drives, the NFS server in a thread, raw RPC peers."""

from __future__ import annotations

import pytest
from nfs3_helpers import Rpc3, Stack, add_export, start_server


@pytest.fixture
def stack(tmp_path):
    s = Stack(tmp_path)
    yield s
    s.close()


@pytest.fixture
def server(stack):
    add_export(stack.catalog)
    srv = start_server(stack)
    yield srv
    srv.stop()


@pytest.fixture
def rpc(server):
    peers = []

    def connect(**kwargs) -> Rpc3:
        peers.append(Rpc3(server.port, **kwargs))
        return peers[-1]

    yield connect
    for peer in peers:
        peer.close()
