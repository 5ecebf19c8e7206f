"""docs/grafana and docs/prometheus: they parse, and name only metrics that /metrics emits."""

from __future__ import annotations

import json
import re
from pathlib import Path

from engine.admin import exports, jobs, metrics
from engine.admin.quota_service import QuotaService
from tests.webui.helpers import mkdirs

DOCS = Path(__file__).resolve().parent.parent.parent / "docs"
RULES = DOCS / "prometheus" / "shingle-rules.yml"
DASHBOARD = DOCS / "grafana" / "shingle-dashboard.json"
METRIC_RE = re.compile(r"\bshingle_[a-z0-9_]+")


def load_rules() -> list[dict]:
    """The rules, through PyYAML when it is installed, else from the file's own simple layout."""
    try:
        import yaml
    except ImportError:
        yaml = None
    text = RULES.read_text()
    if yaml is not None:
        doc = yaml.safe_load(text)
        return [rule for group in doc["groups"] for rule in group["rules"]]
    rules = []
    for line in text.splitlines():
        if m := re.fullmatch(r"\s*- alert: (\S+)", line):
            rules.append({"alert": m[1]})
        elif m := re.fullmatch(r"\s+expr: (.+)", line):
            rules[-1]["expr"] = m[1]
    assert text.lstrip().startswith("#") and "\ngroups:\n" in text and "\t" not in text
    return rules


def emitted(app, catalog) -> set[str]:
    """Metric names /metrics emits with every kind of sample the daemon records."""
    exports.ensure_default(catalog)
    export_id = exports.list_exports(catalog)[0].id
    metrics.record_sample(
        catalog,
        nfs_ops=3,
        nfs_ops_read=3,
        nfs_read_bytes=10,
        nfs_write_bytes=5,
        nfs_latency_le_1=1,
        nfs_latency_le_inf=3,
        nfs_latency_sum_s=0.1,
        nfs_latency_read_le_1=1,
        nfs_latency_read_le_inf=3,
        nfs_latency_read_sum_s=0.1,
        client_bytes_written=5,
        media_bytes_written=7,
        drive_1_read_bytes=1,
        drive_1_written_bytes=2,
        drive_1_read_errors=0,
        drive_1_write_errors=0,
        drive_1_checksum_errors=0,
        **{f"export_{export_id}_{k}": 1 for k in ("read_bytes", "write_bytes", "ops")},
    )
    for kind in ("scrub", "rebuild", "retention"):
        job = jobs.submit(catalog, kind, {}, actor="test")
        jobs.claim(catalog, job)
        jobs.finish(catalog, job, ok=True, result={})
    namespace = app.extensions["shingle"].namespace
    mkdirs(namespace, "/quota-tree")
    QuotaService(namespace).set("/quota-tree", bytes_limit=1 << 30, files_limit=100)
    text = app.test_client().get("/metrics").get_data(as_text=True)
    return {
        re.split(r"[{ ]", line, maxsplit=1)[0]
        for line in text.splitlines()
        if line and line[0] != "#"
    }


def test_alert_rules_parse_and_name_emitted_metrics(app, appliance):
    rules = load_rules()
    names = emitted(app, appliance[1])
    assert len(rules) >= 8 and all(rule.get("alert") and rule.get("expr") for rule in rules)
    for rule in rules:
        used = set(METRIC_RE.findall(str(rule["expr"])))
        assert used and used <= names, (rule["alert"], used - names)
    alerts = {rule["alert"] for rule in rules}
    assert {
        "ShingleDriveFailed",
        "ShingleCapacity90",
        "ShingleMetricsStale",
        "ShingleScrubOverdue",
    } <= alerts


def test_grafana_dashboard_loads_and_names_emitted_metrics(app, appliance):
    doc = json.loads(DASHBOARD.read_text())
    names = emitted(app, appliance[1])
    exprs = [t["expr"] for panel in doc["panels"] for t in panel["targets"]]
    assert doc["title"] == "shingle" and len(exprs) >= 15
    ids = [panel["id"] for panel in doc["panels"]]
    assert len(set(ids)) == len(ids)
    used = {name for expr in exprs for name in METRIC_RE.findall(expr)}
    assert used <= names, used - names
    # every family a person watches has a panel
    for family in (
        "shingle_space_bytes",
        "shingle_drive_errors_total",
        "shingle_nfs_operation_latency_seconds_bucket",
        "shingle_export_read_bytes_total",
        "shingle_job_last_success_timestamp_seconds",
        "shingle_metrics_sample_age_seconds",
    ):
        assert family in used
