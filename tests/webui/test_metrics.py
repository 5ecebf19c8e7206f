"""/metrics in the Prometheus text format, and the samples behind the charts."""

from __future__ import annotations

import re
import time

import pytest

from engine.admin import exports, jobs, metrics
from engine.admin.quota_service import QuotaService
from engine.base.version import version
from engine.catalog.models import Zone
from engine.namespace import ROOT
from tests.webui.conftest import ZONE_SIZE
from tests.webui.helpers import mkdirs


def parse(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_metrics_from_the_catalog_without_samples(app):
    response = app.test_client().get("/metrics")
    assert response.status_code == 200 and response.content_type.startswith(
        "text/plain; version=0.0.4"
    )
    values = parse(response.get_data(as_text=True))
    assert (
        values['shingle_drives{state="online"}'] == 4
        and values['shingle_drives{state="failed"}'] == 0
    )
    assert values['shingle_bands{state="empty",class="none"}'] == 4 * 16 - 4
    assert values['shingle_bands{state="full",class="warm"}'] == 1
    assert values['shingle_band_garbage_bytes{class="cold"}'] == 3 * (1 << 20) // 4
    assert values['shingle_capacity_bytes{kind="total"}'] == 4 * 16 * (1 << 20)
    # one host (the head's own drives): losing it loses everything
    assert values["shingle_hosts"] == 1 and values["shingle_hosts_losable"] == 0
    text = response.get_data(as_text=True)
    assert (
        "shingle_write_amplification" not in text and "shingle_nfs" not in text
    )  # no samples: not invented
    assert "shingle_metrics_sample_age_seconds" not in text
    assert "shingle_drive_read_bytes" not in text


def test_metrics_from_recorded_samples(app, appliance):
    _, catalog = appliance
    metrics.record_sample(
        catalog,
        nfs_read_bytes=5 << 20,
        nfs_write_bytes=3 << 20,
        nfs_ops_read=40,
        nfs_ops_write=25,
        client_bytes_written=3 << 20,
        media_bytes_written=15 << 19,
        nfs_latency_le_1=30,
        nfs_latency_le_10=60,
        nfs_latency_le_inf=65,
        nfs_latency_sum_s=0.25,
        nfs_delegations_granted=7,
        nfs_delegations_revoked=1,
        nfs_offload_started=3,
        nfs_offload_callbacks_answered=2,
    )
    text = app.test_client().get("/metrics").get_data(as_text=True)
    values = parse(text)
    assert values["shingle_write_amplification"] == 2.5
    assert values['shingle_nfs_operations_total{op="read"}'] == 40
    assert values['shingle_nfs_bytes_total{direction="write"}'] == 3 << 20
    assert values['shingle_nfs_delegations_total{event="granted"}'] == 7
    assert values['shingle_nfs_delegations_total{event="revoked"}'] == 1
    assert 'shingle_nfs_delegations_total{event="recalled"}' not in text  # not recorded
    assert values['shingle_nfs_offload_total{event="started"}'] == 3
    assert values['shingle_nfs_offload_total{event="callbacks_answered"}'] == 2
    assert values['shingle_nfs_latency_seconds_bucket{le="0.001"}'] == 30
    assert values['shingle_nfs_latency_seconds_bucket{le="+Inf"}'] == 65
    assert (
        values["shingle_nfs_latency_seconds_count"] == 65
        and values["shingle_nfs_latency_seconds_sum"] == 0.25
    )
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


def test_space_states_add_up_to_the_total(app, appliance):
    _, catalog = appliance
    zones = Zone.__table__
    # a full zone written only to 3/4: its last quarter is stranded until the zone is reset
    first_of_drive_2 = zones.update().where(zones.c.drive_id == 2, zones.c.idx == 0)
    catalog.run(
        lambda conn: conn.execute(
            first_of_drive_2.values(
                state="full",
                band_class="warm",
                write_pointer=3 * ZONE_SIZE // 4,
                live_bytes=ZONE_SIZE // 2,
                garbage_bytes=ZONE_SIZE // 4,
            )
        )
    )
    values = parse(app.test_client().get("/metrics").get_data(as_text=True))
    total = values['shingle_capacity_bytes{kind="total"}']
    space = {k: v for k, v in values.items() if k.startswith("shingle_space_bytes")}
    assert set(space) == {
        f'shingle_space_bytes{{state="{s}"}}'
        for s in ("live", "garbage", "reserve", "free", "stranded")
    }
    assert sum(space.values()) == total == 4 * 16 * ZONE_SIZE
    assert space['shingle_space_bytes{state="stranded"}'] == ZONE_SIZE // 4
    # seeded: live 1 + 1/4 + 1/2 + 1/3 zones on drive 1, 1/2 on drive 2
    live = ZONE_SIZE + ZONE_SIZE // 4 + ZONE_SIZE // 2 + ZONE_SIZE // 3 + ZONE_SIZE // 2
    assert space['shingle_space_bytes{state="live"}'] == live
    assert space['shingle_space_bytes{state="garbage"}'] == 3 * ZONE_SIZE // 4 + ZONE_SIZE // 4
    assert sum(v for k, v in values.items() if k.startswith("shingle_capacity_bytes")) == total


def test_per_drive_series_build_info_and_job_successes(app, appliance):
    _, catalog = appliance
    metrics.record_sample(
        catalog,
        drive_1_read_bytes=4096,
        drive_1_written_bytes=8192,
        drive_1_read_errors=0,
        drive_1_write_errors=1,
        drive_1_checksum_errors=2,
        drive_1_device_errors=3,  # a zoned block device's own (engine/drives/blkzoned.py)
        drive_1_off_pointer_errors=0,
        drive_3_read_bytes=5,
    )
    job = jobs.submit(catalog, "scrub", {}, actor="test")
    jobs.claim(catalog, job)
    jobs.finish(catalog, job, ok=True, result={})
    failed = jobs.submit(catalog, "rebuild", {}, actor="test")
    jobs.claim(catalog, failed)
    jobs.finish(catalog, failed, ok=False, message="no")
    text = app.test_client().get("/metrics").get_data(as_text=True)
    values = parse(text)
    assert values['shingle_drive_read_bytes_total{drive="1"}'] == 4096
    assert values['shingle_drive_written_bytes_total{drive="1"}'] == 8192
    assert values['shingle_drive_errors_total{drive="1",kind="checksum"}'] == 2
    assert values['shingle_drive_errors_total{drive="1",kind="write"}'] == 1
    assert values['shingle_drive_errors_total{drive="1",kind="device"}'] == 3
    assert values['shingle_drive_errors_total{drive="1",kind="off_pointer"}'] == 0
    assert values['shingle_drive_read_bytes_total{drive="3"}'] == 5
    assert values['shingle_drive_state{drive="1",state="online"}'] == 1
    assert values['shingle_drive_state{drive="1",state="failed"}'] == 0
    assert values['shingle_drive_zones{drive="1",state="full"}'] == 2
    assert values['shingle_drive_zones{drive="1",state="open"}'] == 2
    assert values['shingle_drive_zones{drive="1",state="empty"}'] == 12
    assert values['shingle_drive_capacity_bytes{drive="4"}'] == 16 * ZONE_SIZE
    build = [k for k in values if k.startswith("shingle_build_info{")]
    assert len(build) == 1 and 'catalog="sqlite"' in build[0]
    assert f'version="{version()}"' in build[0]
    finished = jobs.get(catalog, job).finished_ns / 1e9
    last = values['shingle_job_last_success_timestamp_seconds{kind="scrub"}']
    assert last == pytest.approx(finished)
    assert 'kind="rebuild"' not in text  # failed: not a success
    age = values["shingle_metrics_sample_age_seconds"]
    assert 0 <= age < 60


def test_staleness_grows_with_the_newest_sample(app, appliance):
    _, catalog = appliance
    metrics.record_sample(catalog, time_ns=time.time_ns() - 600 * 10**9, nfs_ops=1)
    values = parse(app.test_client().get("/metrics").get_data(as_text=True))
    assert 600 <= values["shingle_metrics_sample_age_seconds"] < 660


def test_operation_histograms_and_exports_when_the_nfs_server_records_them(app, appliance):
    _, catalog = appliance
    exports.ensure_default(catalog)
    default = exports.list_exports(catalog)[0]
    metrics.record_sample(
        catalog,
        nfs_latency_read_le_1=3,
        nfs_latency_read_le_10=5,
        nfs_latency_read_le_inf=6,
        nfs_latency_read_sum_s=0.5,
        nfs_latency_open_le_1=1,
        nfs_latency_open_le_inf=1,
        **{
            f"export_{default.id}_read_bytes": 100,
            f"export_{default.id}_write_bytes": 7,
            f"export_{default.id}_ops": 9,
        },
    )
    text = app.test_client().get("/metrics").get_data(as_text=True)
    values = parse(text)
    assert values['shingle_nfs_operation_latency_seconds_bucket{op="read",le="0.001"}'] == 3
    assert values['shingle_nfs_operation_latency_seconds_bucket{op="read",le="+Inf"}'] == 6
    assert values['shingle_nfs_operation_latency_seconds_count{op="read"}'] == 6
    assert values['shingle_nfs_operation_latency_seconds_sum{op="read"}'] == 0.5
    assert values['shingle_nfs_operation_latency_seconds_count{op="open"}'] == 1
    # the whole-call histogram had no samples
    assert "shingle_nfs_latency_seconds_bucket" not in text
    label = f'export="{default.name}",id="{default.id}"'
    assert values[f"shingle_export_read_bytes_total{{{label}}}"] == 100
    assert values[f"shingle_export_write_bytes_total{{{label}}}"] == 7
    assert values[f"shingle_export_operations_total{{{label}}}"] == 9


def test_directory_quotas_usage_and_the_limits_that_are_set(app):
    ns = app.extensions["shingle"].namespace
    sub = mkdirs(ns, "/team/sub")
    quotas = QuotaService(ns)
    quotas.set("/team", bytes_limit=1 << 20, soft_files=10)
    values = parse(app.test_client().get("/metrics").get_data(as_text=True))
    assert values['shingle_quota_used_files{path="/team"}'] == 1  # sub
    assert values['shingle_quota_used_bytes{path="/team"}'] == 0
    assert values['shingle_quota_limit_bytes{path="/team",kind="hard"}'] == 1 << 20
    assert values['shingle_quota_limit_files{path="/team",kind="soft"}'] == 10
    # limits that are not set are left out, not reported as 0 (a ratio to them means nothing)
    assert 'shingle_quota_limit_bytes{path="/team",kind="soft"}' not in values
    assert 'shingle_quota_limit_files{path="/team",kind="hard"}' not in values

    ns.create(ROOT, sub.ino, "a")  # counted by the catalog at once: no sample needed
    values = parse(app.test_client().get("/metrics").get_data(as_text=True))
    assert values['shingle_quota_used_files{path="/team"}'] == 2
    quotas.remove("/team")
    assert "shingle_quota" not in app.test_client().get("/metrics").get_data(as_text=True)


def test_kerberos_counters_when_the_server_records_them(app, appliance):
    _, catalog = appliance
    metrics.record_sample(catalog, nfs_gss_live=2, nfs_gss_contexts=5, nfs_gss_replays=1)
    values = parse(app.test_client().get("/metrics").get_data(as_text=True))
    assert values["shingle_nfs_gss_contexts"] == 2
    assert values['shingle_nfs_gss_events_total{event="contexts"}'] == 5
    assert values['shingle_nfs_gss_events_total{event="replays"}'] == 1
