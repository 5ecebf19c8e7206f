"""Quotas through real clients: a hard limit hit over NFSv4.1 and NFSv3 (nfs-rs) fails the
WRITE whole with DQUOT, and NFSv4's quota attributes tell the room left."""

from __future__ import annotations

import errno
import os

import nfs_rs
import pytest
from nfs4_rawclient import RawClient
from nfs4_support import nfsrs

from appliance.nfs.v4 import const as c
from engine.admin.quota_service import QuotaService
from engine.namespace import ROOT

KiB = 1024
LIMIT = 1024 * KiB


@pytest.fixture
def quota(server, stack):
    ns = stack.namespace
    ns.mkdir(ROOT, ns.root_ino, "team")
    return QuotaService(ns).set("/export/team", bytes_limit=LIMIT, soft_bytes=LIMIT // 2)


def nfsrs3(port: int):
    return nfs_rs.Client.connect(
        f"nfs://127.0.0.1:{port}/export?version=3&nfsport={port}&mountport={port}",
        noresvport=True,
        connect_timeout=20,
        operation_timeout=60,
    )


def _used(stack) -> int:
    return QuotaService(stack.namespace).get("/team").used_bytes


@pytest.mark.parametrize("version", ["4.1", "3"])
def test_a_write_past_the_hard_limit_fails_whole_with_dquot(server, stack, quota, version):
    first = os.urandom(700 * KiB)
    connect = nfsrs if version == "4.1" else nfsrs3
    with connect(server.port) as cl:
        with cl.open("team/first", "wb") as f:
            f.write(first)
        assert _used(stack) == len(first)
        with pytest.raises(nfs_rs.NfsError) as raised:
            with cl.open("team/second", "wb") as f:
                f.write(os.urandom(400 * KiB))  # one WRITE of 400 KiB: 1100 KiB > 1024 KiB
        error = raised.value
        want = c.NFS4ERR_DQUOT if version == "4.1" else 69  # NFS3ERR_DQUOT
        assert (error.code, error.errno) == (want, errno.EDQUOT), (error.code, error.errno)
        assert cl.stat("team/second").size == 0  # nothing of the refused WRITE was kept
        assert _used(stack) == len(first)
        with cl.open("team/first", "rb") as f:
            assert f.read() == first
        with cl.open("team/third", "wb") as f:  # what still fits is taken
            f.write(b"z" * (LIMIT - len(first)))
        assert _used(stack) == LIMIT


def _getattr_quota(raw: RawClient, fh: bytes) -> tuple[int, int, int]:
    bits = [0, 1 << (c.FATTR4_QUOTA_AVAIL_HARD - 32) | 1 << (c.FATTR4_QUOTA_AVAIL_SOFT - 32)]
    bits[1] |= 1 << (c.FATTR4_QUOTA_USED - 32)
    st, res = raw.session([(c.OP_PUTFH, fh), (c.OP_GETATTR, bits)])
    assert st == 0
    values = res[-1][2].attr_vals
    return tuple(int.from_bytes(values[i : i + 8], "big") for i in (0, 8, 16))  # type: ignore


def test_quota_attributes_over_nfsv4(server, stack, quota):
    with nfsrs(server.port) as cl:
        with cl.open("team/data", "wb") as f:
            f.write(b"d" * (300 * KiB))
    raw = RawClient(server.port).setup()
    try:
        root = raw.root_fh()
        st, res = raw.session([(c.OP_PUTFH, root), (c.OP_LOOKUP, "team"), (c.OP_GETFH, None)])
        team = res[-1][2]
        st, res = raw.session([(c.OP_PUTFH, team), (c.OP_LOOKUP, "data"), (c.OP_GETFH, None)])
        data = res[-1][2]
        for fh in (team, data):
            assert _getattr_quota(raw, fh) == (
                LIMIT - 300 * KiB,
                LIMIT // 2 - 300 * KiB,
                300 * KiB,
            )
        # outside every quota tree: the pool's free space, and the file's own use
        hard, soft, used = _getattr_quota(raw, root)
        free = stack.namespace.statfs().avail_bytes
        assert hard == soft and abs(hard - free) <= 1 << 20 and used == 0
        st, res = raw.session([(c.OP_PUTFH, root), (c.OP_GETATTR, [1 << c.FATTR4_SUPPORTED_ATTRS])])
        assert st == 0
    finally:
        raw.close()
