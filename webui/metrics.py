"""/metrics in the Prometheus text format (version 0.0.4).

Gauges come from the catalog (capacity, drive states and zones, band counts, the last
successful job of each kind, directory quotas' usage and limits); counters of the NFS server
and of each drive, write amplification and the latency histograms come from the newest samples
the daemon recorded (engine.admin.metrics), with ``shingle_metrics_sample_age_seconds`` saying how
old they are. A metric with no data is left out rather than reported as zero. Capacity is split
so that sums mean something: ``shingle_space_bytes{state}`` adds up to
``shingle_capacity_bytes{kind="total"}``. Read-only and without secrets, so it needs no sign-in
(Prometheus scrapes it); bind the web UI to a trusted address. docs/grafana/ and
docs/prometheus/ hold a dashboard and alert rules over these names."""

from __future__ import annotations

import re
import time

from flask import Blueprint, Response

from engine.admin import exports as export_service
from engine.admin import inventory
from engine.admin import metrics as samples
from engine.base.version import python_version, version
from webui import core

bp = Blueprint("metrics", __name__)
STATES = ("online", "degraded", "failed", "draining", "removed", "missing")
LATENCY_RE = re.compile(r"nfs_latency_(?:(?P<op>[a-z0-9_]+?)_)?le_(?P<le>inf|\d+(?:_\d+)?)")
OP_LATENCY_SUM_RE = re.compile(r"nfs_latency_(?P<op>[a-z0-9_]+)_sum_s")
DRIVE_RE = re.compile(
    r"drive_(?P<id>\d+)_(?P<what>read_bytes|written_bytes|read_errors|write_errors"
    r"|checksum_errors|device_errors|off_pointer_errors)"
)
EXPORT_RE = re.compile(r"export_(?P<id>\d+)_(?P<what>read_bytes|write_bytes|ops)")
JOB_KINDS = ("scrub", "rebuild", "retention", "drain", "tier", "clean", "trash-purge")


def _label(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Exposition:
    def __init__(self):
        self.lines: list[str] = []

    def family(
        self, name: str, kind: str, help_text: str, samples_: list[tuple[dict, float]]
    ) -> None:
        if not samples_:
            return
        self.lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for labels, value in samples_:
            self.sample(name, labels, value)

    def histogram(self, name: str, help_text: str, series: dict[tuple, dict]) -> None:
        """``series``: labels (as sorted items) -> {"buckets": [(le, count)], "sum": s or None}."""
        if not series:
            return
        self.lines += [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        for labels, data in sorted(series.items()):
            buckets = sorted(data["buckets"])
            for bound, count in buckets:
                le = "+Inf" if bound == float("inf") else repr(bound)
                self.sample(f"{name}_bucket", {**dict(labels), "le": le}, count)
            if buckets and buckets[-1][0] == float("inf"):
                self.sample(f"{name}_count", dict(labels), buckets[-1][1])
            if data.get("sum") is not None:
                self.sample(f"{name}_sum", dict(labels), data["sum"])

    def sample(self, name: str, labels: dict, value: float) -> None:
        text = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
        number = repr(float(value)) if value != int(value) else str(int(value))
        self.lines.append(f"{name}{{{text}}} {number}" if text else f"{name} {number}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def render() -> str:
    shingle = core.ctx()
    catalog = shingle.catalog
    report = _status(shingle)
    out = Exposition()
    out.family(
        "shingle_build_info",
        "gauge",
        "This build: version, Python and catalog dialect (always 1).",
        [
            (
                {
                    "version": version(),
                    "python": python_version(),
                    "catalog": report["catalog"]["backend"],
                },
                1,
            )
        ],
    )
    _capacity(out, report)
    _drives(out, report)
    _leader(out, shingle)
    _redundancy_and_alerts(out, report, catalog)
    _hosts(out, shingle)
    _bands(out, catalog)
    latest = _jobs_and_samples(out, catalog)
    _nfs(out, latest)
    _exports(out, latest, catalog)
    _quotas(out)
    _smb(out, shingle)
    return out.text()


def _capacity(out: Exposition, report: dict) -> None:
    from appliance.facade import space_by_state

    cap = report["capacity"]
    out.family(
        "shingle_capacity_bytes",
        "gauge",
        "Raw capacity of the usable drives (online, degraded, "
        "draining); shingle_space_bytes splits it.",
        [({"kind": "total"}, cap["raw_bytes"])],
    )
    out.family(
        "shingle_space_bytes",
        "gauge",
        'Raw bytes by state; the states add up to shingle_capacity_bytes{kind="total"}.',
        [({"state": state}, n) for state, n in space_by_state(cap).items()],
    )
    out.family(
        "shingle_usable_capacity_bytes",
        "gauge",
        "User data the usable drives hold when full (after parity and the cleaning reserve).",
        [({}, cap["usable_bytes"])],
    )
    out.family(
        "shingle_usable_free_bytes",
        "gauge",
        "User data that still fits (after parity).",
        [({}, cap["free_bytes"])],
    )


def _redundancy_and_alerts(out: Exposition, report: dict, catalog) -> None:
    """Stripes under-protected and lost, the hosts that may be lost, active alerts."""
    red = report["redundancy"]
    out.family(
        "shingle_stripes_under_protected",
        "gauge",
        "Live stripes missing at least one fragment (rebuild or add drives to restore them).",
        [({}, red["under_protected"])],
    )
    hosts = report["hosts"]
    out.family(
        "shingle_hosts",
        "gauge",
        "Storage hosts (failure domains) with drives in the pool.",
        [({}, hosts["count"])],
    )
    losable = hosts["losable"]
    out.family(
        "shingle_hosts_losable",
        "gauge",
        "Hosts that may be lost with every stored stripe still readable (before any stripe "
        "is stored: those a stripe written now survives).",
        [({}, hosts["losable_by_placement"] if losable is None else losable)],
    )
    from engine.admin.alerts import AlertService

    active = AlertService(catalog).count_active()
    out.family(
        "shingle_alerts_active",
        "gauge",
        "Active (raised, not acknowledged) alerts by severity; the Alerts page lists them.",
        [({"severity": sev}, active.get(sev, 0)) for sev in ("warning", "critical")],
    )
    out.family(
        "shingle_stripes_lost",
        "gauge",
        "Live stripes with fewer readable fragments than they need (data loss).",
        [({}, red["lost"])],
    )


def _hosts(out: Exposition, shingle) -> None:
    """Each storage host (failure domain): its state, its drives by state, what it holds and
    what waits to be moved off it (engine.admin.hosts, the Hosts page's figures)."""
    from engine.admin import hosts as hosts_view
    from engine.admin.hosts import HOST_STATES

    k, m = hosts_view.stripe_shape(shingle.policies)
    found = hosts_view.cluster(shingle.catalog, k, m).hosts
    out.family(
        "shingle_host_state",
        "gauge",
        "1 for the state each host is in, 0 for the others (up: every drive online; draining: "
        "every drive draining; lost: no drive serves reads; degraded: anything between).",
        [({"host": h.name, "state": s}, int(h.state == s)) for h in found for s in HOST_STATES],
    )
    out.family(
        "shingle_host_drives",
        "gauge",
        "Each host's drives by state (removed drives are out of the pool and not counted).",
        [
            ({"host": h.name, "state": s}, sum(d.state == s for d in h.drives))
            for h in found
            for s in STATES
            if s != "removed"
        ],
    )
    out.family(
        "shingle_host_capacity_bytes",
        "gauge",
        "Each host's drives' zones times zone size.",
        [({"host": h.name}, h.capacity_bytes) for h in found],
    )
    out.family(
        "shingle_host_fragments",
        "gauge",
        "Stripe fragments each host's drives hold.",
        [({"host": h.name}, h.fragments) for h in found],
    )
    out.family(
        "shingle_host_fragment_bytes",
        "gauge",
        "Bytes of the stripe fragments each host's drives hold.",
        [({"host": h.name}, h.fragment_bytes) for h in found],
    )
    out.family(
        "shingle_host_waiting_fragments",
        "gauge",
        "Fragments on each host's failed, missing or draining drives: what a rebuild or a "
        "drain has yet to move to other hosts.",
        [({"host": h.name}, h.waiting_fragments) for h in found],
    )


def _bands(out: Exposition, catalog) -> None:
    rows = inventory.bands_by_state(catalog)
    out.family(
        "shingle_bands",
        "gauge",
        "Zones (bands) by state and band class.",
        [({"state": r[0], "class": r[1] or "none"}, r[2]) for r in rows],
    )
    out.family(
        "shingle_band_garbage_bytes",
        "gauge",
        "Dead bytes in bands, by band class (band cleaning reclaims them).",
        _sum_by_class(rows, 4),
    )
    out.family(
        "shingle_band_live_bytes",
        "gauge",
        "Live bytes in bands, by band class.",
        _sum_by_class(rows, 3),
    )
    _compression(out, inventory.compression_by_class(catalog))


def _jobs_and_samples(out: Exposition, catalog) -> dict:
    """The last success of each job kind, and the counters of the newest samples (returned:
    the NFS and export families read them too)."""
    finished = samples.last_job_success(catalog)
    out.family(
        "shingle_job_last_success_timestamp_seconds",
        "gauge",
        "When the newest job of each kind that ended done finished (Unix time).",
        [({"kind": k}, finished[k] / 1e9) for k in JOB_KINDS if k in finished],
    )

    latest = samples.latest(catalog)
    newest = samples.newest_sample_ns(catalog)
    if newest is not None:
        out.family(
            "shingle_metrics_sample_age_seconds",
            "gauge",
            "Age of the newest sample the daemon "
            "recorded; counters below are that old (the daemon samples every "
            "maintenance.metrics_interval_s).",
            [({}, max(time.time_ns() - newest, 0) / 1e9)],
        )
    client, media = latest.get("client_bytes_written"), latest.get("media_bytes_written")
    if client and media is not None:
        out.family(
            "shingle_write_amplification",
            "gauge",
            "Bytes written to media per byte clients wrote "
            "(parity, replicas and band cleaning included).",
            [({}, media / client)],
        )
    _drive_counters(out, latest)
    _decompression(out, latest)
    return latest


def _quotas(out: Exposition) -> None:
    """Usage and limits of each directory quota (kept exact by the catalog: no sample needed);
    a limit that is not set is left out, so ``used / limit`` exists only where it means
    something."""
    from webui.quotas import list_quotas

    quotas = list_quotas()
    for what, unit in (("bytes", "Bytes"), ("files", "Files and folders")):
        out.family(
            f"shingle_quota_used_{what}",
            "gauge",
            f"{unit} in the tree of each directory quota.",
            [({"path": q["path"]}, q[f"used_{what}"]) for q in quotas],
        )
        out.family(
            f"shingle_quota_limit_{what}",
            "gauge",
            f"{unit} a directory quota allows: hard (writes past it fail) and soft (warned).",
            [
                ({"path": q["path"], "kind": kind}, q[key])
                for q in quotas
                for kind, key in (("hard", f"{what}_limit"), ("soft", f"soft_{what}"))
                if q[key] is not None
            ],
        )


def _smb(out: Exposition, shingle) -> None:
    """smbd's health and sessions, read now (smbstatus), once the daemon has served SMB here;
    nothing at all on an appliance that never did."""
    from appliance.facade import SambaLayout, smb_status

    report = smb_status(SambaLayout.for_data_dir(shingle.config.data_dir))
    if not report["enabled"]:
        return
    out.family(
        "shingle_smb_up",
        "gauge",
        "1 while smbd runs (the daemon serves SMB), else 0.",
        [({}, int(report["running"]))],
    )
    out.family(
        "shingle_smb_problem",
        "gauge",
        "1 while the daemon reports why SMB cannot serve (shingle status, alert smb_problem).",
        [({}, int(report["problem"] is not None))],
    )
    if report["running"] and report["error"] is None:
        out.family(
            "shingle_smb_sessions",
            "gauge",
            "SMB sessions connected to smbd now.",
            [({}, len(report["sessions"]))],
        )


def _compression(out: Exposition, by_class: dict[str, dict]) -> None:
    """Per band class from the catalog's stripes: data per stored byte, and the two sums."""
    classes = sorted(by_class.items())
    out.family(
        "shingle_compression_ratio",
        "gauge",
        "User bytes per stored byte of the stripes of each band class (1: nothing compressed; "
        "tiering compresses stripes it writes into classes with zstd, such as cold).",
        [({"class": name}, c["ratio"]) for name, c in classes],
    )
    out.family(
        "shingle_stripe_data_bytes",
        "gauge",
        "User bytes the stripes of each band class hold.",
        [({"class": name}, c["data_bytes"]) for name, c in classes],
    )
    out.family(
        "shingle_stripe_stored_bytes",
        "gauge",
        "Bytes the stripes of each band class encode (compressed frames, raw stripes as they "
        "are), before erasure coding.",
        [({"class": name}, c["stored_bytes"]) for name, c in classes],
    )
    out.family(
        "shingle_stripes_compressed",
        "gauge",
        "Stripes stored compressed, by band class.",
        [({"class": name}, c["compressed"]) for name, c in classes],
    )


def _decompression(out: Exposition, latest: dict[str, float]) -> None:
    for name, sample, help_text in (
        ("shingle_stripes_decompressed_total", "stripes_decompressed", "Compressed stripes read"),
        (
            "shingle_decompressed_bytes_total",
            "decompressed_bytes",
            "User bytes of the compressed stripes read",
        ),
        (
            "shingle_decompress_seconds_total",
            "decompress_s",
            "CPU seconds the read path spent decompressing",
        ),
    ):
        if sample in latest:
            out.family(name, "counter", help_text + ".", [({}, latest[sample])])


def _leader(out: Exposition, shingle) -> None:
    """The cluster's maintenance leader from the catalog's fence (no etcd request per scrape);
    nothing on a single host."""
    from appliance.facade import leader_report

    leader = leader_report(shingle.catalog, shingle.config, ask_etcd=False)
    if leader is None:
        return
    out.family(
        "shingle_leader_token",
        "gauge",
        "Fencing token of the maintenance leader that took office last, by host (0: none yet); "
        "it rises at each change of leader.",
        [({"holder": leader["holder"] or ""}, leader["token"] or 0)],
    )


def _status(shingle) -> dict:
    from appliance.facade import gather

    return gather(shingle.catalog, shingle.policies, shingle.config.get("storage.reserve_zones"))


def _drives(out: Exposition, report: dict) -> None:
    drives = report["drives"]
    states = {s: 0 for s in STATES}
    for d in drives:
        states[d["state"]] = states.get(d["state"], 0) + 1
    out.family(
        "shingle_drives",
        "gauge",
        "Drives by state.",
        [({"state": s}, n) for s, n in states.items()],
    )
    out.family(
        "shingle_drive_info",
        "gauge",
        "One per drive: its path, backend and uuid (always 1).",
        [
            (
                {
                    "drive": str(d["id"]),
                    "path": d["path"],
                    "backend": d["backend"],
                    "uuid": d["uuid"],
                },
                1,
            )
            for d in drives
        ],
    )
    out.family(
        "shingle_drive_state",
        "gauge",
        "1 for the state each drive is in, 0 for the others.",
        [
            ({"drive": str(d["id"]), "state": s}, int(d["state"] == s))
            for d in drives
            for s in STATES
        ],
    )
    out.family(
        "shingle_drive_capacity_bytes",
        "gauge",
        "Each drive's zones times zone size.",
        [({"drive": str(d["id"])}, d["size_bytes"]) for d in drives],
    )
    out.family(
        "shingle_drive_zones",
        "gauge",
        "Each drive's zones by state (empty zones are free).",
        [
            ({"drive": str(d["id"]), "state": s}, d[f"zones_{s}"])
            for d in drives
            for s in ("empty", "open", "full")
        ],
    )


def _drive_counters(out: Exposition, latest: dict) -> None:
    found: dict[str, list] = {}
    for name, value in latest.items():
        m = DRIVE_RE.fullmatch(name)
        if m:
            found.setdefault(m["what"], []).append(({"drive": m["id"]}, value))
    for key in found:
        found[key].sort(key=lambda item: int(item[0]["drive"]))
    out.family(
        "shingle_drive_read_bytes_total",
        "counter",
        "Bytes read from each drive (its own counter, since the daemon started).",
        found.get("read_bytes", []),
    )
    out.family(
        "shingle_drive_written_bytes_total",
        "counter",
        "Bytes written to each drive (its own counter, since the daemon started).",
        found.get("written_bytes", []),
    )
    errors = [
        ({**labels, "kind": kind}, v)
        for kind in ("read", "write", "checksum", "device", "off_pointer")
        for labels, v in found.get(f"{kind}_errors", [])
    ]
    out.family(
        "shingle_drive_errors_total",
        "counter",
        "I/O errors and checksum mismatches, per drive. Zoned block devices add kind=device "
        "(errors the device returned, also counted as read or write) and kind=off_pointer "
        "(writes the device refused as off its write pointer: expected 0).",
        sorted(errors, key=lambda item: (int(item[0]["drive"]), item[0]["kind"])),
    )


def _nfs(out: Exposition, latest: dict) -> None:
    out.family(
        "shingle_nfs_operations_total",
        "counter",
        "NFS operations served, by operation.",
        [
            ({"op": name[len("nfs_ops_") :]}, v)
            for name, v in sorted(latest.items())
            if name.startswith("nfs_ops_")
        ]
        or ([({"op": "all"}, latest["nfs_ops"])] if "nfs_ops" in latest else []),
    )
    out.family(
        "shingle_nfs_bytes_total",
        "counter",
        "NFS payload bytes, by direction.",
        [
            ({"direction": d}, latest[f"nfs_{d}_bytes"])
            for d in ("read", "write")
            if f"nfs_{d}_bytes" in latest
        ],
    )
    out.family(
        "shingle_nfs_delegations_total",
        "counter",
        "NFSv4 delegations, by event: granted (read and write), granted_write, recalled, "
        "revoked (not returned within a lease of the recall), returned, cb_getattr (another "
        "client's GETATTR answered from a write delegation's holder); with several heads "
        "other_head_waits (a request that waited for another head's delegation, each try) "
        "and other_head_recalls (recalls another head asked of this one).",
        [
            ({"event": event}, latest[f"nfs_delegations_{event}"])
            for event in (
                "granted",
                "granted_write",
                "recalled",
                "revoked",
                "returned",
                "cb_getattr",
                "other_head_waits",
                "other_head_recalls",
            )
            if f"nfs_delegations_{event}" in latest
        ],
    )
    out.family(
        "shingle_nfs_offload_total",
        "counter",
        "NFSv4.2 asynchronous COPYs, by event: started, completed, failed, cancelled, "
        "synchronous (asked for, done synchronously), callbacks_answered, callbacks_failed.",
        [
            ({"event": event[len("nfs_offload_") :]}, value)
            for event, value in sorted(latest.items())
            if event.startswith("nfs_offload_")
        ],
    )
    whole: dict[tuple, dict] = {}
    per_op: dict[tuple, dict] = {}
    for name, value in latest.items():
        m = LATENCY_RE.fullmatch(name)
        if m:
            bound = float("inf") if m["le"] == "inf" else float(m["le"].replace("_", ".")) / 1000
            target = (
                whole.setdefault((), {"buckets": [], "sum": latest.get("nfs_latency_sum_s")})
                if m["op"] is None
                else per_op.setdefault(
                    (("op", m["op"]),),
                    {"buckets": [], "sum": latest.get(f"nfs_latency_{m['op']}_sum_s")},
                )
            )
            target["buckets"].append((bound, value))
    out.histogram("shingle_nfs_latency_seconds", "NFS call latency (whole RPC calls).", whole)
    out.histogram("shingle_nfs_operation_latency_seconds", "NFS latency by operation.", per_op)
    _gss(out, latest)


def _gss(out: Exposition, latest: dict) -> None:
    """RPCSEC_GSS (Kerberos) counters, when the NFS server takes it (appliance/nfs/onc/gss.py)."""
    gss = {k[len("nfs_gss_") :]: v for k, v in latest.items() if k.startswith("nfs_gss_")}
    if not gss:
        return
    out.family(
        "shingle_nfs_gss_contexts",
        "gauge",
        "Live RPCSEC_GSS (Kerberos) contexts.",
        [({}, gss.pop("live", 0))],
    )
    out.family(
        "shingle_nfs_gss_events_total",
        "counter",
        "RPCSEC_GSS events: contexts made and destroyed, calls refused (bad MIC, unknown or "
        "expired context), replays dropped, context creations that failed.",
        [({"event": event}, v) for event, v in sorted(gss.items())],
    )


def _exports(out: Exposition, latest: dict, catalog) -> None:
    found: dict[str, list] = {}
    for name, value in latest.items():
        m = EXPORT_RE.fullmatch(name)
        if m:
            found.setdefault(m["what"], []).append((int(m["id"]), value))
    if not found:
        return
    names = {e.id: e.name for e in export_service.list_exports(catalog)}

    def series(what: str) -> list[tuple[dict, float]]:
        return [
            ({"export": names.get(i, str(i)), "id": str(i)}, v)
            for i, v in sorted(found.get(what, []))
        ]

    out.family(
        "shingle_export_read_bytes_total",
        "counter",
        "NFS bytes read, per export.",
        series("read_bytes"),
    )
    out.family(
        "shingle_export_write_bytes_total",
        "counter",
        "NFS bytes written, per export.",
        series("write_bytes"),
    )
    out.family(
        "shingle_export_operations_total", "counter", "NFS operations, per export.", series("ops")
    )


def _sum_by_class(rows, column: int) -> list[tuple[dict, float]]:
    sums: dict[str, int] = {}
    for r in rows:
        sums[r[1] or "none"] = sums.get(r[1] or "none", 0) + int(r[column] or 0)
    return [({"class": k}, v) for k, v in sorted(sums.items())]


@bp.route("/metrics")
def index():
    return Response(render(), content_type="text/plain; version=0.0.4; charset=utf-8")
