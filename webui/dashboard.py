"""Dashboard: capacity per tier, drive states, NFS throughput over the last hour, recent events."""

from __future__ import annotations

import time

from flask import Blueprint, render_template

from appliance.facade import SPACE_STATES, gather, leader_report, space_by_state
from engine.admin import events, inventory, metrics
from webui import charts, core

bp = Blueprint("dashboard", __name__)
HOUR_NS = 3600 * 10**9
THROUGHPUT_COUNTERS = (("read", "nfs_read_bytes"), ("write", "nfs_write_bytes"))


def summary() -> dict:
    """Everything the dashboard shows, as plain data (the API returns the same)."""
    shingle = core.ctx()
    config = shingle.config
    report = gather(shingle.catalog, shingle.policies, config.get("storage.reserve_zones"))
    tiers = {
        name: {key: usage[key] for key in ("written_bytes", "live_bytes", "garbage_bytes")}
        for name, usage in inventory.usage_by_class(shingle.catalog).items()
    }
    states: dict[str, int] = {}
    for drive in report["drives"]:
        states[drive["state"]] = states.get(drive["state"], 0) + 1
    now = time.time_ns()
    throughput = {}
    for label, name in THROUGHPUT_COUNTERS:
        throughput[label] = metrics.rates(
            metrics.series(shingle.catalog, name, now - HOUR_NS - 60 * 10**9)
        )
    return {
        "capacity": report["capacity"],
        "space": space_by_state(report["capacity"]),
        "tiers": tiers,
        "drive_states": states,
        "drives": len(report["drives"]),
        "catalog": report["catalog"],
        "redundancy": report["redundancy"],
        "hosts": report["hosts"],
        "throughput": {k: [[t, v] for t, v in pts] for k, pts in throughput.items()},
        "window": [now - HOUR_NS, now],
        "leader": leader_report(shingle.catalog, config),
    }


SPACE_CLASSES = {  # the bar's css classes (webui/static/style.css)
    "garbage": "z-garbage",
    "reserve": "c-reserve",
    "free": "z-empty",
    "stranded": "c-stranded",
}


def live_by_class(live: int, tiers: dict) -> list[tuple[str, float, str]]:
    """The live bytes of the usable drives split by band class for the capacity bar. Zone usage
    by class also counts failed and missing drives: past the usable drives' total, the classes
    are scaled down to it, so that the bar's parts add up to the figures above it."""
    by_class = {name: t["live_bytes"] for name, t in sorted(tiers.items()) if t["live_bytes"]}
    counted = sum(by_class.values())
    scale = live / counted if counted > live else 1
    out: list[tuple[str, float, str]] = [
        (f"{name} live", round(n * scale), f"c-{name}") for name, n in by_class.items()
    ]
    rest = live - sum(n for _, n, _ in out)
    if rest > 0 or not out:
        out.append(("other live" if out else "live", rest, "c-none"))
    return out


def rate_fmt(v: float) -> str:
    return core.fmt_size(v) + "/s"


@bp.route("/")
@core.login_required
def index():
    data = summary()
    # one set of figures for the header and the bar: the raw space of the usable drives by state
    space = data["space"]
    segments = live_by_class(space["live"], data["tiers"])
    segments += [(state, space[state], SPACE_CLASSES[state]) for state in SPACE_STATES[1:]]
    capacity_svg = charts.stacked_bar(
        segments, core.fmt_size, width=1000, label="raw capacity by state"
    )
    state_items = [
        (state, n, str(n), f"s-{state}") for state, n in sorted(data["drive_states"].items())
    ]
    drives_svg = charts.bars(state_items, width=480, label="drives by state")
    start, end = data["window"]
    throughput_svg = charts.line_chart(
        {label: [(t, v) for t, v in pts] for label, pts in data["throughput"].items()},
        start,
        end,
        rate_fmt,
        label="NFS throughput, last hour",
        empty_message="no throughput samples in the last hour "
        "(the daemon records them while it serves NFS)",
    )
    recent = events.recent(core.ctx().catalog, 12)
    from engine.admin import jobs
    from engine.lifecycle.drives import redundancy_status

    return render_template(
        "dashboard.html",
        data=data,
        capacity_svg=capacity_svg,
        drives_svg=drives_svg,
        throughput_svg=throughput_svg,
        recent=recent,
        jobs=jobs.recent(core.ctx().catalog, 5),
        redundancy=redundancy_status(core.ctx().catalog),
    )
