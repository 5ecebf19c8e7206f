"""/metrics in the Prometheus text format (version 0.0.4).

Gauges come from the catalog (capacity, drive states, band counts); NFS
counters, write amplification and the latency histogram come from the newest
samples the daemon recorded (engine.metrics). A metric with no data is left
out rather than reported as zero. Read-only and without secrets, so it needs
no sign-in (Prometheus scrapes it); bind the web UI to a trusted address."""
from __future__ import annotations

import re

from flask import Blueprint, Response

from engine import inventory
from engine import metrics as samples
from webui import core

bp = Blueprint("metrics", __name__)
STATES = ("online", "degraded", "failed", "draining", "missing", "removed")
LATENCY_RE = re.compile(r"nfs_latency_le_(inf|\d+(?:_\d+)?)")


def _label(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Exposition:
    def __init__(self):
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str, samples_: list[tuple[dict, float]]) -> None:
        if not samples_:
            return
        self.lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for labels, value in samples_:
            self.sample(name, labels, value)

    def sample(self, name: str, labels: dict, value: float) -> None:
        text = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
        number = repr(float(value)) if value != int(value) else str(int(value))
        self.lines.append(f"{name}{{{text}}} {number}" if text else f"{name} {number}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def render() -> str:
    shingle = core.ctx()
    config = shingle.config
    from appliance.status import gather
    report = gather(shingle.catalog, shingle.policies, config.get("storage.reserve_zones"))
    out = Exposition()
    cap = report["capacity"]
    out.family("shingle_capacity_bytes", "gauge", "Capacity by kind (raw, usable, free, written, live, garbage, "
               "reserve).", [({"kind": k[:-6]}, v) for k, v in cap.items() if k.endswith("_bytes")])
    states = {s: 0 for s in STATES}
    for d in report["drives"]:
        states[d["state"]] = states.get(d["state"], 0) + 1
    out.family("shingle_drives", "gauge", "Drives by state.", [({"state": s}, n) for s, n in states.items()])
    rows = inventory.bands_by_state(shingle.catalog)
    out.family("shingle_bands", "gauge", "Zones (bands) by state and band class.",
               [({"state": r[0], "class": r[1] or "none"}, r[2]) for r in rows])
    out.family("shingle_band_garbage_bytes", "gauge", "Dead bytes in bands, by band class (band cleaning "
               "reclaims them).", _sum_by_class(rows, 4))
    out.family("shingle_band_live_bytes", "gauge", "Live bytes in bands, by band class.", _sum_by_class(rows, 3))

    latest = samples.latest(shingle.catalog)
    client, media = latest.get("client_bytes_written"), latest.get("media_bytes_written")
    if client and media is not None:
        out.family("shingle_write_amplification", "gauge", "Bytes written to media per byte clients wrote "
                   "(parity, replicas and band cleaning included).", [({}, media / client)])
    out.family("shingle_nfs_operations_total", "counter", "NFS operations served, by operation.",
               [({"op": name[len("nfs_ops_"):]}, v) for name, v in sorted(latest.items())
                if name.startswith("nfs_ops_")] or ([({"op": "all"}, latest["nfs_ops"])] if "nfs_ops" in latest
                                                    else []))
    out.family("shingle_nfs_bytes_total", "counter", "NFS payload bytes, by direction.",
               [({"direction": d}, latest[f"nfs_{d}_bytes"]) for d in ("read", "write")
                if f"nfs_{d}_bytes" in latest])
    buckets = []
    for name, value in latest.items():
        m = LATENCY_RE.fullmatch(name)
        if m:
            le = "+Inf" if m.group(1) == "inf" else repr(float(m.group(1).replace("_", ".")) / 1000)
            buckets.append((float("inf") if le == "+Inf" else float(le), le, value))
    if buckets:
        buckets.sort()
        out.lines += ["# HELP shingle_nfs_latency_seconds NFS operation latency.",
                      "# TYPE shingle_nfs_latency_seconds histogram"]
        for _, le, value in buckets:
            out.sample("shingle_nfs_latency_seconds_bucket", {"le": le}, value)
        if buckets[-1][1] == "+Inf":
            out.sample("shingle_nfs_latency_seconds_count", {}, buckets[-1][2])
        if "nfs_latency_sum_s" in latest:
            out.sample("shingle_nfs_latency_seconds_sum", {}, latest["nfs_latency_sum_s"])
    return out.text()


def _sum_by_class(rows, column: int) -> list[tuple[dict, float]]:
    sums: dict[str, int] = {}
    for r in rows:
        sums[r[1] or "none"] = sums.get(r[1] or "none", 0) + int(r[column] or 0)
    return [({"class": k}, v) for k, v in sorted(sums.items())]


@bp.route("/metrics")
def index():
    return Response(render(), content_type="text/plain; version=0.0.4; charset=utf-8")
