"""/metrics in the Prometheus text format, and the samples behind the charts."""
from __future__ import annotations

import re

import pytest

from engine import metrics


def parse(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_metrics_from_the_catalog_without_samples(app):
    response = app.test_client().get("/metrics")
    assert response.status_code == 200 and response.content_type.startswith("text/plain; version=0.0.4")
    values = parse(response.get_data(as_text=True))
    assert values['shingle_drives{state="online"}'] == 4 and values['shingle_drives{state="failed"}'] == 0
    assert values['shingle_bands{state="empty",class="none"}'] == 4 * 16 - 4
    assert values['shingle_bands{state="full",class="warm"}'] == 1
    assert values['shingle_band_garbage_bytes{class="cold"}'] == 3 * (1 << 20) // 4
    assert values['shingle_capacity_bytes{kind="raw"}'] == 4 * 16 * (1 << 20)
    text = response.get_data(as_text=True)
    assert "shingle_write_amplification" not in text and "shingle_nfs" not in text  # no samples: not invented


def test_metrics_from_recorded_samples(app, appliance):
    _, catalog = appliance
    metrics.record_sample(catalog, nfs_read_bytes=5 << 20, nfs_write_bytes=3 << 20, nfs_ops_read=40,
                          nfs_ops_write=25, client_bytes_written=3 << 20, media_bytes_written=15 << 19,
                          nfs_latency_le_1=30, nfs_latency_le_10=60, nfs_latency_le_inf=65, nfs_latency_sum_s=0.25)
    text = app.test_client().get("/metrics").get_data(as_text=True)
    values = parse(text)
    assert values["shingle_write_amplification"] == 2.5
    assert values['shingle_nfs_operations_total{op="read"}'] == 40
    assert values['shingle_nfs_bytes_total{direction="write"}'] == 3 << 20
    assert values['shingle_nfs_latency_seconds_bucket{le="0.001"}'] == 30
    assert values['shingle_nfs_latency_seconds_bucket{le="+Inf"}'] == 65
    assert values["shingle_nfs_latency_seconds_count"] == 65 and values["shingle_nfs_latency_seconds_sum"] == 0.25
    assert re.search(r"# TYPE shingle_nfs_latency_seconds histogram", text)
    buckets = re.findall(r'le="([^"]+)"', text)
    assert buckets == ["0.001", "0.01", "+Inf"]  # ascending, as Prometheus requires


def test_rates_handle_restarts_and_bad_samples_are_refused(appliance):
    _, catalog = appliance
    s = 10**9
    for t, v in ((1, 0), (2, 100), (4, 300), (5, 50)):  # the daemon restarted before t=5
        metrics.record_sample(catalog, time_ns=t * s, nfs_read_bytes=v)
    points = metrics.series(catalog, "nfs_read_bytes", 0)
    assert metrics.rates(points) == [(2 * s, 100.0), (4 * s, 100.0), (5 * s, 50.0)]
    assert metrics.latest(catalog) == {"nfs_read_bytes": 50.0}
    with pytest.raises(ValueError, match="expected a number"):
        metrics.record_sample(catalog, nfs_read_bytes="lots")
    with pytest.raises(ValueError, match="counter name 'Bad-Name'"):
        metrics.record_sample(catalog, **{"Bad-Name": 1})


def test_samples_older_than_the_keep_window_are_pruned(appliance):
    _, catalog = appliance
    week = metrics.KEEP_SECONDS * 10**9
    metrics.record_sample(catalog, time_ns=10**9, nfs_read_bytes=1, nfs_ops=1)
    metrics.record_sample(catalog, time_ns=10**9 + week // 2, nfs_read_bytes=2)
    metrics.record_sample(catalog, time_ns=2 * 10**9 + week, nfs_read_bytes=3)
    assert [v for _, v in metrics.series(catalog, "nfs_read_bytes", 0)] == [2.0, 3.0]
    assert metrics.series(catalog, "nfs_ops", 0) == [(10**9, 1.0)]  # not recorded since: left alone
