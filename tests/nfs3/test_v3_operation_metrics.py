"""NFSv3 procedures timed per procedure and counted per export (appliance/nfs/stats.py),
after real traffic from nfs-rs over NFSv3."""

from __future__ import annotations

import os

from nfs3_helpers import MiB, nfsrs3
from sqlalchemy import select

from appliance.nfs.stats import OP_LATENCY_BUCKETS_MS, bound_name
from engine.catalog.models import Export


def test_v3_procedures_have_histograms_and_export_counters(server, stack):
    export_id = stack.catalog.read(lambda c: c.execute(select(Export.__table__.c.id)).scalar())
    payload = os.urandom(MiB // 2 + 3)
    with nfsrs3(server.port) as cl:
        with cl.open("v3.bin", "wb") as f:
            f.write(payload)
        for _ in range(10):
            cl.stat("v3.bin")
        with cl.open("v3.bin", "rb") as f:
            assert f.read() == payload
    stats = server.stats()
    bounds = [bound_name(ms) for ms in OP_LATENCY_BUCKETS_MS] + ["inf"]
    for op in ("v3_getattr", "v3_write", "v3_read", "v3_lookup"):
        counts = [stats[f"nfs_latency_{op}_le_{b}"] for b in bounds]
        assert counts == sorted(counts) and counts[-1] == stats[f"nfs_ops_{op}"] > 0, (op, counts)
    assert stats[f"export_{export_id}_read_bytes"] >= len(payload)
    assert stats[f"export_{export_id}_write_bytes"] >= len(payload)
    assert stats[f"export_{export_id}_ops"] >= stats["nfs_ops_v3_getattr"] >= 10
