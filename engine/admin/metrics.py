"""Time series of the appliance's counters, kept in the catalog for the web UI.

The daemon calls ``record_sample(catalog, nfs_read_bytes=..., ...)`` every few
seconds with CUMULATIVE counters (totals since it started, like Prometheus
counters); rates are derived between consecutive samples, and a value that
goes down marks a daemon restart rather than negative traffic.

Counter names (the daemon records what it has; charts show what exists):
- ``nfs_read_bytes``, ``nfs_write_bytes``: payload bytes served / accepted
- ``nfs_ops``: all NFS operations; ``nfs_ops_<op>`` per operation (e.g. nfs_ops_read)
- ``client_bytes_written``, ``media_bytes_written``: for write amplification
- ``stripes_decompressed``, ``decompressed_bytes``, ``decompress_s``: compressed (cold) stripes
  the read path decompressed, their user bytes, and the CPU seconds it took
- ``nfs_latency_le_<ms>``: cumulative count of operations at most <ms> milliseconds
  (a histogram bucket; ``nfs_latency_le_inf`` = all), ``nfs_latency_sum_s``
- ``nfs_compounds_from_cache``, ``nfs_compounds_handed_off``: COMPOUNDs the event loop
  answered from the caches, and those it tried and passed to a worker thread
- ``nfs_latency_<op>_le_<ms>``, ``nfs_latency_<op>_sum_s``: the histogram per operation, when the
  NFS server records one (``<op>`` as in nfs_ops_<op>)
- ``nfs_delegations_<event>``: delegations granted (``granted_write`` of them write ones),
  recalled, revoked and returned, and CB_GETATTRs answered (``cb_getattr``); with several
  heads ``other_head_waits`` and ``other_head_recalls`` (docs/delegations.md)
- ``nfs_offload_<event>``: asynchronous COPYs started, completed, failed, cancelled, asked for
  but done synchronously, and their CB_OFFLOADs answered or failed
- ``nfs_slot_retries_<event>``: NFSv4.1 retries on a session slot (the same slot and seqid
  again): ``replayed`` from the slot's kept reply, ``rerun`` (they changed nothing),
  ``uncached`` (NFS4ERR_RETRY_UNCACHED_REP), ``delayed`` (NFS4ERR_DELAY: still running); and
  ``false`` (NFS4ERR_SEQ_FALSE_RETRY), ``reused`` (a seqid reused after a request that changed
  nothing); ``nfs_slot_replies_bytes``, what the slots keep, ``nfs_slot_replies_reserved_bytes``,
  what the sessions reserved, and ``nfs_sessions_<shrunk|refused>``, sessions granted less than
  they asked or refused (appliance/nfs/state/replies.py)
- ``nfs_gss_<event>``: RPCSEC_GSS counters (contexts, destroyed, refused, replays, failed_init)
  and ``nfs_gss_live`` (contexts alive), when the NFS server has a keytab
- ``export_<id>_read_bytes``, ``export_<id>_write_bytes``, ``export_<id>_ops``: per export, when
  the NFS server records them
- ``drive_<id>_read_bytes``, ``drive_<id>_written_bytes``, ``drive_<id>_read_errors``,
  ``drive_<id>_write_errors``, ``drive_<id>_checksum_errors``: each drive's own I/O
  (engine.drives.ZonedDrive.io_counters); a zoned block device adds ``drive_<id>_device_errors``
  and ``drive_<id>_off_pointer_errors`` (engine/drives/blkzoned.py)
Samples older than ``KEEP_SECONDS`` are pruned as new ones arrive."""

from __future__ import annotations

import itertools
import re
import time

from sqlalchemy import func, select

from engine.catalog.database import Catalog
from engine.catalog.models import Job, MetricSample

SAMPLES = MetricSample.__table__
JOBS = Job.__table__
KEEP_SECONDS = 7 * 24 * 3600
NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,63}")


def record_sample(catalog: Catalog, *, time_ns: int | None = None, **counters: float) -> None:
    """Store one reading of each counter, all stamped with the same time."""
    now = time_ns if time_ns is not None else time.time_ns()
    rows = []
    for name, value in counters.items():
        if not NAME_RE.fullmatch(name):
            raise ValueError(
                f"counter name {name!r}: expected lower-case letters, digits and _, at most 64"
            )
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"counter {name} = {value!r}: expected a number")
        rows.append({"time_ns": now, "name": name, "value": float(value)})
    if not rows:
        return

    cutoff = now - KEEP_SECONDS * 1_000_000_000

    def work(conn):
        conn.execute(SAMPLES.insert(), rows)
        # By name: the (name, time_ns) index turns the prune into short range
        # scans, not a table scan.
        conn.execute(
            SAMPLES.delete().where(
                SAMPLES.c.name.in_([r["name"] for r in rows]), SAMPLES.c.time_ns < cutoff
            )
        )

    catalog.run(work, tracked=True, published=True)  # samples are cached nowhere


def series(catalog: Catalog, name: str, since_ns: int) -> list[tuple[int, float]]:
    """(time_ns, value) readings of one counter since a moment, oldest first."""

    def work(conn):
        return [
            (r.time_ns, r.value)
            for r in conn.execute(
                select(SAMPLES.c.time_ns, SAMPLES.c.value)
                .where(SAMPLES.c.name == name, SAMPLES.c.time_ns >= since_ns)
                .order_by(SAMPLES.c.time_ns)
            )
        ]

    return catalog.read(work)


def rates(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """Per-second rates between consecutive readings of a cumulative counter.

    A drop means the counter restarted from zero, so the new value itself is the increase."""
    out = []
    for (t0, v0), (t1, v1) in itertools.pairwise(points):
        seconds = (t1 - t0) / 1e9
        if seconds <= 0:
            continue
        increase = v1 - v0 if v1 >= v0 else v1
        out.append((t1, increase / seconds))
    return out


LATEST_ROWS = 5000  # newest rows looked at by latest(): many samples' worth of every counter


def latest(catalog: Catalog) -> dict[str, float]:
    """The most recent reading of every counter the daemon still records.

    Reads the newest rows by id (ids grow with time, so this is an index walk from the
    end) instead of grouping a week of samples on every /metrics scrape; a counter no
    longer recorded drops out."""

    def work(conn):
        out: dict[str, float] = {}
        for name, value in conn.execute(
            select(SAMPLES.c.name, SAMPLES.c.value).order_by(SAMPLES.c.id.desc()).limit(LATEST_ROWS)
        ):
            out.setdefault(name, value)
        return out

    return catalog.read(work)


def newest_sample_ns(catalog: Catalog) -> int | None:
    """When the daemon last recorded a sample (None: never); /metrics reports the age."""
    return catalog.read(
        lambda conn: conn.execute(
            select(SAMPLES.c.time_ns).order_by(SAMPLES.c.id.desc()).limit(1)
        ).scalar()
    )


def last_job_success(catalog: Catalog) -> dict[str, int]:
    """Job kind -> finish time (ns) of its newest job that ended done."""

    def work(conn):
        return {
            kind: finished
            for kind, finished in conn.execute(
                select(JOBS.c.kind, func.max(JOBS.c.finished_ns))
                .where(JOBS.c.state == "done")
                .group_by(JOBS.c.kind)
            )
            if finished is not None
        }

    return catalog.read(work)
