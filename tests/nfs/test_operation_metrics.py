"""Per-operation latency histograms and per-export counters, as the NFS server records them
for the daemon's samples (appliance/nfs/stats.py), after real traffic from nfs-rs."""

from __future__ import annotations

import os
import re
import threading

from nfs4_support import MiB, nfsrs
from sqlalchemy import select

from appliance.nfs.stats import FOLD_BATCH, OP_LATENCY_BUCKETS_MS, NfsStats, bound_name
from engine.catalog.models import Export


def buckets_of(stats: dict, op: str) -> list[float]:
    """The op's cumulative bucket counts in bound order, +Inf last."""
    bounds = [bound_name(ms) for ms in OP_LATENCY_BUCKETS_MS] + ["inf"]
    return [stats[f"nfs_latency_{op}_le_{b}"] for b in bounds]


def test_nfsrs_traffic_is_timed_per_operation_and_counted_per_export(server, stack):
    export_id = stack.catalog.read(lambda c: c.execute(select(Export.__table__.c.id)).scalar())
    payload = os.urandom(MiB + 7)
    with nfsrs(server.port) as cl:
        with cl.open("data.bin", "wb") as f:
            f.write(payload)
        for _ in range(20):
            cl.stat("data.bin")
        with cl.open("data.bin", "rb") as f:
            assert f.read() == payload
    stats = server.stats()
    ops = {m[1] for name in stats if (m := re.fullmatch(r"nfs_latency_(\w+?)_le_inf", name))}
    assert {"getattr", "write", "read", "putfh", "open"} <= ops, ops
    for op in ops:
        counts = buckets_of(stats, op)
        assert counts == sorted(counts), (op, counts)  # cumulative: never fewer at a higher bound
        assert counts[-1] == stats[f"nfs_ops_{op}"]  # every counted operation was timed
        assert stats[f"nfs_latency_{op}_sum_s"] > 0
    assert stats["nfs_latency_getattr_le_inf"] >= 20
    assert stats[f"export_{export_id}_read_bytes"] == stats["nfs_read_bytes"] >= len(payload)
    assert stats[f"export_{export_id}_write_bytes"] == stats["nfs_write_bytes"] >= len(payload)
    # every operation on a file of the export (all but those before the first PUTROOTFH...)
    assert 0 < stats[f"export_{export_id}_ops"] <= stats["nfs_ops"]
    assert stats[f"export_{export_id}_ops"] >= stats["nfs_ops_getattr"]


def test_bucket_bounds_and_names():
    stats = NfsStats()
    stats.op_done("v3_getattr", 0.0003, 5)  # 0.3 ms: in the 0.5 ms bucket and above
    stats.op_done("v3_getattr", 9.0, 5)  # beyond the last bound: only +Inf
    stats.op_done("v3_read", 0.002, None)
    stats.read(10, 5)
    stats.write(3, 5)
    out = stats.snapshot()
    assert out["nfs_latency_v3_getattr_le_0_25"] == 0
    assert out["nfs_latency_v3_getattr_le_0_5"] == 1
    assert out["nfs_latency_v3_getattr_le_1000"] == 1
    assert out["nfs_latency_v3_getattr_le_inf"] == 2
    assert out["nfs_latency_v3_getattr_sum_s"] == 9.0003
    assert out["nfs_latency_v3_read_le_2_5"] == 1 and out["nfs_latency_v3_read_le_1"] == 0
    assert (out["export_5_ops"], out["export_5_read_bytes"], out["export_5_write_bytes"]) == (
        2,
        10,
        3,
    )
    assert out["nfs_ops"] == 3
    assert all(
        re.fullmatch(r"[a-z][a-z0-9_]{0,63}", name) for name in out
    )  # engine.admin.metrics names


def test_a_compound_is_recorded_without_the_lock_and_counted_by_the_next_snapshot():
    """The request's path appends its COMPOUND's list; counting waits for a fold (every
    FOLD_BATCH COMPOUNDs, and each snapshot), so a snapshot still holds every COMPOUND before it."""

    class Node:
        export = None

    stats = NfsStats()
    with stats._lock:  # held: a recording that took it would wait here
        done = threading.Thread(target=stats.ops_done, args=([("putfh", 0.0001, Node())],))
        done.start()
        done.join(5)
        assert not done.is_alive(), "ops_done waited for the counters' lock"
    out = stats.snapshot()
    assert out["nfs_ops_putfh"] == out["nfs_latency_putfh_le_0_1"] == 1 == out["nfs_ops"]
    for _ in range(FOLD_BATCH * 3 + 1):
        stats.ops_done([("getattr", 0.002, None), ("read", 0.02, None)])
    assert len(stats._unfolded) < FOLD_BATCH  # folded along the way: the queue stays short
    out = stats.snapshot()
    assert out["nfs_ops_getattr"] == out["nfs_ops_read"] == FOLD_BATCH * 3 + 1
    assert out["nfs_latency_read_le_50"] - out["nfs_latency_read_le_10"] == FOLD_BATCH * 3 + 1
