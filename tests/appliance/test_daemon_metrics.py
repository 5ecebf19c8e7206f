"""End to end: a real client works against `shingle serve`, the daemon samples its
counters, and the web UI's /metrics reports them."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

from pgserver import free_port
from test_cli_lifecycle import shingle

from appliance import config as config_mod
from appliance.runtime import open_catalog
from engine.admin import metrics


def test_nfs_traffic_reaches_metrics(tmp_path):
    import nfs_rs

    home = tmp_path / "a"
    port = free_port()
    shingle(
        "init", str(home), "--drive-size", "128MiB", "--zone-size", "8MiB", "--nfs-port", str(port)
    )
    path = home / "shingle.toml"
    text, count = re.subn(
        r"^# metrics_interval_s = .*$", "metrics_interval_s = 0.5", path.read_text(), flags=re.M
    )
    assert count == 1
    # the malloc line is an internal detail, logged at debug
    text, count = re.subn(r'^# level = "info"$', 'level = "debug"', text, flags=re.M)
    assert count == 1
    path.write_text(text)
    daemon = subprocess.Popen(
        [sys.executable, "-m", "appliance.cli", "-c", str(path), "serve", "--no-web"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        startup = []
        for line in daemon.stdout:
            startup.append(line)
            if "nfs://" in line:
                break
        assert any("malloc: buffers up to 32 MiB are reused" in line for line in startup), startup
        client = nfs_rs.Client.connect(
            f"nfs://127.0.0.1:{port}/export?version=4.1",
            nfs_port=port,
            noresvport=True,
            uid=0,
            gid=0,
            connect_timeout=20,
            operation_timeout=60,
        )
        payload = bytes(range(256)) * 4096  # 1 MiB
        with client.open("/data.bin", "wb") as f:
            f.write(payload)
        with client.open("/data.bin", "rb") as f:
            assert f.read() == payload
        catalog = open_catalog(config_mod.load(path))
        try:
            deadline = time.monotonic() + 30
            latest = {}
            while time.monotonic() < deadline:
                latest = metrics.latest(catalog)
                if latest.get("nfs_read_bytes", 0) >= len(payload) and latest.get(
                    "client_bytes_written", 0
                ):
                    break
                time.sleep(0.2)
        finally:
            catalog.close()
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)
    assert latest["nfs_write_bytes"] >= len(payload)
    assert latest["nfs_read_bytes"] >= len(payload)
    assert latest["nfs_ops_write"] >= 1 and latest["nfs_ops_read"] >= 1
    assert latest["client_bytes_written"] >= len(payload)
    # 8+2 erasure coding: at least 10/8 media bytes per user byte
    assert latest["media_bytes_written"] >= latest["client_bytes_written"] * 10 / 8
    assert (
        latest["nfs_latency_le_inf"] >= latest["nfs_ops_write"] and latest["nfs_latency_sum_s"] > 0
    )
    # each drive counts its own appends: together at least what the data path placed on media
    drive_written = [v for k, v in latest.items() if re.fullmatch(r"drive_\d+_written_bytes", k)]
    assert len(drive_written) == 10 and sum(drive_written) >= latest["media_bytes_written"]
    assert sum(1 for v in drive_written if v > 0) == 10  # an 8+2 stripe touches every drive

    from webui.app import create_app

    app = create_app(config_mod.load(path))
    body = app.test_client().get("/metrics").get_data(as_text=True)
    assert "shingle_nfs_latency_seconds_bucket" in body
    assert re.search(r'op="write"', body)
    assert re.search(r'shingle_drive_written_bytes_total\{drive="1"\} [1-9]', body)
    # per operation (op label) and per export, recorded by the NFS server itself
    counts = [
        float(v)
        for v in re.findall(
            r'^shingle_nfs_operation_latency_seconds_bucket\{op="write",le="[^"]+"\} (\S+)$',
            body,
            flags=re.M,
        )
    ]
    assert len(counts) > 2 and counts == sorted(counts) and counts[-1] >= 1, counts
    assert re.search(r'^shingle_nfs_operation_latency_seconds_count\{op="read"\} [1-9]', body, re.M)
    assert re.search(
        r'^shingle_export_read_bytes_total\{export="/export",id="\d+"\} (\d{7,})', body, re.M
    )
