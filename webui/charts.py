"""Server-rendered SVG charts (no front-end build step, no JavaScript).

Colours come from CSS classes in static/style.css, so the charts follow the
page's theme. Every chart given no data says so instead of drawing zeros."""

from __future__ import annotations

import datetime

from markupsafe import Markup, escape


def _svg(width: int, height: int, body: list[str], label: str) -> Markup:
    # Drawn at its own pixel size and only ever shrunk (CSS max-width), so text keeps its size.
    return Markup(
        f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'role="img" aria-label="{escape(label)}" xmlns="http://www.w3.org/2000/svg">'
        + "".join(body)
        + "</svg>"
    )


def empty(message: str, width: int = 600, height: int = 60) -> Markup:
    return _svg(
        width,
        height,
        [
            f'<rect class="empty-bg" x="0" y="0" width="{width}" height="{height}" rx="6"/>',
            f'<text class="empty-text" x="{width / 2}" y="{height / 2 + 5}" '
            f'text-anchor="middle">{escape(message)}</text>',
        ],
        message,
    )


def stacked_bar(
    segments: list[tuple[str, float, str]], fmt=str, *, width: int = 600, label: str = ""
) -> Markup:
    """One bar split into (label, value, css class) segments, with a legend below."""
    total = sum(max(v, 0) for _, v, _ in segments)
    if total <= 0:
        return empty(f"{label}: nothing to show" if label else "nothing to show", width)
    body, x, bar_h = [], 0.0, 26
    for name, value, cls in segments:
        if value <= 0:
            continue
        w = width * value / total
        body.append(
            f'<rect class="{escape(cls)}" x="{x:.1f}" y="0" width="{w:.1f}" height="{bar_h}">'
            f"<title>{escape(name)}: {escape(fmt(value))}</title></rect>"
        )
        x += w
    lx, ly = 0, bar_h + 22
    for name, value, cls in segments:
        text = f"{name} {fmt(value)}"
        body.append(
            f'<rect class="{escape(cls)}" x="{lx}" y="{ly - 10}" width="10" height="10"/>'
            f'<text class="legend" x="{lx + 14}" y="{ly}">{escape(text)}</text>'
        )
        lx += 24 + 7 * len(text)
        if lx > width - 120:
            lx, ly = 0, ly + 18
    return _svg(width, ly + 8, body, label or "stacked bar")


def bars(items: list[tuple[str, float, str, str]], *, width: int = 600, label: str = "") -> Markup:
    """Horizontal bars: (label, value, value text, css class)."""
    if not items:
        return empty(f"{label}: nothing to show" if label else "nothing to show", width)
    top = max((v for _, v, _, _ in items), default=0) or 1
    row, label_w = 24, 140
    body = []
    for i, (name, value, text, cls) in enumerate(items):
        y = i * row
        w = (width - label_w - 90) * max(value, 0) / top
        body.append(
            f'<text class="axis" x="0" y="{y + 16}">{escape(name)}</text>'
            f'<rect class="{escape(cls)}" x="{label_w}" y="{y + 4}" width="{w:.1f}" '
            f'height="{row - 8}"/>'
            f'<text class="value" x="{label_w + w + 6:.1f}" y="{y + 16}">{escape(text)}</text>'
        )
    return _svg(width, row * len(items), body, label or "bars")


def line_chart(
    series: dict[str, list[tuple[int, float]]],
    start_ns: int,
    end_ns: int,
    fmt=str,
    *,
    width: int = 1000,
    height: int = 200,
    label: str = "",
    empty_message: str = "no data",
) -> Markup:
    """Lines over a time window; ``series`` maps a name to (time_ns, value) points."""
    points = [p for pts in series.values() for p in pts if start_ns <= p[0] <= end_ns]
    if not points:
        return empty(empty_message, width, 70)
    left, right, top, bottom = 76, 10, 26, 24
    plot_w, plot_h = width - left - right, height - top - bottom
    vmax = max(v for _, v in points) or 1.0
    span = max(end_ns - start_ns, 1)

    def xy(t, v):
        return left + plot_w * (t - start_ns) / span, top + plot_h * (1 - v / vmax)

    body = [
        f'<line class="grid" x1="{left}" y1="{top}" x2="{left + plot_w}" y2="{top}"/>',
        f'<line class="grid" x1="{left}" y1="{top + plot_h / 2}" x2="{left + plot_w}" '
        f'y2="{top + plot_h / 2}"/>',
        f'<line class="axis-line" x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" '
        f'y2="{top + plot_h}"/>',
        f'<text class="axis" x="{left - 6}" y="{top + 10}" '
        f'text-anchor="end">{escape(fmt(vmax))}</text>',
        f'<text class="axis" x="{left - 6}" y="{top + plot_h / 2 + 4}" '
        f'text-anchor="end">{escape(fmt(vmax / 2))}</text>',
        f'<text class="axis" x="{left - 6}" y="{top + plot_h}" text-anchor="end">0</text>',
    ]
    for frac in (0, 0.5, 1):
        t = start_ns + span * frac
        stamp = datetime.datetime.fromtimestamp(t / 1e9, datetime.UTC).strftime("%H:%M")
        anchor = {0: "start", 0.5: "middle", 1: "end"}[frac]
        body.append(
            f'<text class="axis" x="{left + plot_w * frac:.1f}" y="{height - 6}" '
            f'text-anchor="{anchor}">{stamp}</text>'
        )
    legend_x = left + 8
    for i, (name, pts) in enumerate(series.items()):
        pts = [p for p in pts if start_ns <= p[0] <= end_ns]
        cls = f"series-{i % 4}"
        if len(pts) == 1:
            x, y = xy(*pts[0])
            body.append(f'<circle class="{cls}" cx="{x:.1f}" cy="{y:.1f}" r="3"/>')
        elif pts:
            coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(t, v) for t, v in pts))
            body.append(f'<polyline class="line {cls}" points="{coords}"/>')
        body.append(
            f'<rect class="{cls}" x="{legend_x}" y="4" width="10" height="10"/>'
            f'<text class="legend" x="{legend_x + 14}" y="13">{escape(name)}</text>'
        )
        legend_x += 30 + 7 * len(name)
    return _svg(width, height, body, label or "line chart")


ZONE_STATES = ("empty", "open", "full", "garbage", "offline")


def zone_kind(zone: dict) -> str:
    """empty | open | full | garbage (a full zone mostly holding dead bytes:
    cleaning's next pick) | offline."""
    state = zone["state"]
    if state == "full" and zone.get("garbage_bytes", 0) > zone.get("live_bytes", 0):
        return "garbage"
    return state if state in ZONE_STATES else "offline"


MAX_CELLS = 2048  # a 20 TB drive has ~80,000 zones: beyond this, one cell stands for a run of zones


def zone_cells(zones: list[dict]) -> list[dict]:
    """Per-zone rows (idx, state, band_class, write_pointer, live/garbage bytes,
    zone_size) -> map cells."""
    cells = []
    for i, z in enumerate(zones):
        kind = zone_kind(z)
        cells.append(
            {
                "label": f"zone {z.get('idx', i)}",
                "kind": kind,
                "band_class": z.get("band_class"),
                "fill": z.get("write_pointer", 0) / (z.get("zone_size") or 1),
                "detail": kind,
            }
        )
    return cells


def band_map(cells: list[dict], *, label: str = "band map") -> Markup:
    """One square per cell (a zone, or a run of zones on big drives): colour by state and band
    class, an open band filled as far as it is written."""
    if not cells:
        return empty("no zones recorded for this drive", 480)
    columns, cell = (16, 24) if len(cells) <= 128 else (64, 10)
    gap = 2 if cell > 12 else 1
    rows = (len(cells) + columns - 1) // columns
    body = []
    for i, c in enumerate(cells):
        x, y = (i % columns) * cell, (i // columns) * cell
        cls = f"zone z-{c['kind']}" + (f" c-{c['band_class']}" if c["band_class"] else "")
        fill = min(max(c["fill"], 0.0), 1.0)
        title = (
            f"{c['label']}: {c['detail']}"
            + (f", {c['band_class']}" if c["band_class"] else "")
            + f", {fill * 100:.0f}% written"
        )
        body.append(
            f'<rect class="{escape(cls)}" x="{x}" y="{y}" width="{cell - gap}" '
            f'height="{cell - gap}">'
            f"<title>{escape(title)}</title></rect>"
        )
        if 0 < fill < 1 and c["kind"] == "open":
            h = (cell - gap) * fill
            body.append(
                f'<rect class="fill c-{escape(c["band_class"] or "none")}" x="{x}" '
                f'y="{y + cell - gap - h:.1f}" width="{cell - gap}" height="{h:.1f}"/>'
            )
    return _svg(columns * cell, rows * cell, body, label)
