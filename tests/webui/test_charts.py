"""Server-rendered SVG charts: data drawn, labels escaped, no data said plainly."""

from __future__ import annotations

from webui import charts


def test_band_map_draws_each_zone():
    zones = [
        {
            "idx": i,
            "state": "full" if i % 3 == 0 else "empty",
            "band_class": "cold" if i % 3 == 0 else None,
            "write_pointer": 256 if i % 3 == 0 else 0,
            "live_bytes": 200,
            "garbage_bytes": 0,
            "zone_size": 256,
        }
        for i in range(30)
    ]
    svg = str(charts.band_map(charts.zone_cells(zones)))
    assert svg.count('<rect class="zone') == 30 and "zone 3: full, cold, 100% written" in svg
    assert "no zones recorded" in str(charts.band_map([]))


def test_garbage_zones_are_told_apart():
    zone = {"state": "full", "live_bytes": 10, "garbage_bytes": 90}
    assert charts.zone_kind(zone) == "garbage"
    assert charts.zone_kind({"state": "full", "live_bytes": 90, "garbage_bytes": 10}) == "full"
    assert charts.zone_kind({"state": "weird"}) == "offline"


def test_line_chart_and_bars_escape_labels_and_say_when_empty():
    svg = str(charts.line_chart({"<read>": [(10, 5.0), (20, 10.0)]}, 0, 30, lambda v: f"{v:g} B/s"))
    assert "&lt;read&gt;" in svg and "<read>" not in svg and "<polyline" in svg and "10 B/s" in svg
    assert "nothing in window" in str(
        charts.line_chart({"x": [(100, 1.0)]}, 0, 30, empty_message="nothing in window")
    )
    assert "nothing to show" in str(charts.bars([]))
    assert "free 0" not in str(charts.stacked_bar([("free", 0, "z-empty")], str))
    svg = str(charts.stacked_bar([("used", 25, "c-warm"), ("free", 75, "z-empty")], str))
    assert 'width="150.0"' in svg and 'width="450.0"' in svg  # 25 % / 75 % of 600
