"""The web UI as admins run it: `shingle webui` under gunicorn, and on a PostgreSQL catalog."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from appliance import config as config_mod
from engine.catalog import upgrade
from tests.webui.conftest import FAKE_SMARTCTL, Browserish
from tests.webui.helpers import exists, make_checkpoints

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def fetch(url: str, method: str = "GET", body: bytes | None = None):
    request = urllib.request.Request(url, data=body, method=method,
                                     headers={"Content-Type": "application/json"} if body else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


LOGFMT = re.compile(r'ts=\S+Z level=(debug|info|warning|error|critical) logger=\S+ msg=".*"$')


def test_shingle_webui_runs_gunicorn_in_the_foreground(template_catalog, tmp_path):
    import shutil
    shutil.copyfile(template_catalog, tmp_path / "catalog.db")
    port = free_port()
    config_path = tmp_path / "shingle.toml"
    config_path.write_text(config_mod.render({"appliance.data_dir": ".", "catalog.url": "sqlite:///catalog.db",
                                              "smart.smartctl": str(FAKE_SMARTCTL), "webui.workers": 1}))
    proc = subprocess.Popen([sys.executable, "-m", "appliance.cli", "-c", str(config_path), "webui",
                             "--port", str(port)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        first = proc.stdout.readline()
        assert first.startswith(f"Web UI: http://127.0.0.1:{port}/") and "initial-admin-password" in first
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                status, _, body = fetch(base + "/login")
                break
            except (ConnectionError, urllib.error.URLError):
                assert proc.poll() is None and time.monotonic() < deadline, "gunicorn did not start"
                time.sleep(0.2)
        assert status == 200 and b"Sign in" in body
        status, headers, body = fetch(base + "/api/v1/openapi.json")
        assert status == 200 and json.loads(body)["info"]["title"] == "shingle admin API"
        status, headers, body = fetch(base + "/metrics")
        assert status == 200 and b'shingle_drives{state="online"} 4' in body
        status, _, body = fetch(base + "/api/v1/retention/rules", "POST", b'{"pattern": "/x/*", "keep": 1}')
        assert status == 401 and "authentication required" in json.loads(body)["error"]
        assert (tmp_path / "webui-secret.key").exists()  # created by the first worker, mode 0600
        assert (tmp_path / "webui-secret.key").stat().st_mode & 0o077 == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()  # never leave a server behind a failed test
            out, _ = proc.communicate()
    assert proc.returncode == 0, out
    assert "Booting worker" in out
    # gunicorn logs in the daemon's format (appliance/log.py): one format in the journal
    logged = [line for line in out.splitlines()[1:] if line]
    assert logged and all(LOGFMT.match(line) for line in logged), logged
    assert any("logger=gunicorn.access" in line and "/metrics" in line for line in logged)


def test_shingle_webui_refuses_a_bad_port_or_catalog(tmp_path):
    config_path = tmp_path / "shingle.toml"
    config_path.write_text(config_mod.render({"appliance.data_dir": ".", "catalog.url": "sqlite:///missing.db"}))
    result = subprocess.run([sys.executable, "-m", "appliance.cli", "-c", str(config_path), "webui"], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "catalog at schema revision" in result.stderr


def test_web_ui_on_a_postgresql_catalog(postgres_server, tmp_path):
    from engine import jobs, metrics
    from tests.webui.conftest import Live
    url = postgres_server.create_database()
    upgrade(url)
    live = Live(url, tmp_path)
    try:
        web = Browserish(live.app.test_client())
        assert web.login().status_code == 302
        make_checkpoints(live.namespace, "/checkpoints/pg", range(1, 6), size=20_000)
        response = web.api("POST", "/api/v1/retention/rules", {"pattern": "/checkpoints/*/step-*", "keep": 3})
        assert response.status_code == 201
        preview = web.get("/api/v1/retention/preview").get_json()
        assert [p["path"] for p in preview] == ["/checkpoints/pg/step-1", "/checkpoints/pg/step-2"]
        job = web.api("POST", "/api/v1/retention/run", {}).get_json()
        assert jobs.wait(live.catalog, job["id"], timeout_s=30, poll_s=0.05).state == "done"
        assert not exists(live.namespace, "/checkpoints/pg/step-1") and exists(live.namespace, "/checkpoints/pg/step-3")
        metrics.record_sample(live.catalog, nfs_read_bytes=1, nfs_write_bytes=2, nfs_ops_read=3)
        for page in ("/", "/drives", "/retention", "/exports", "/tiers", "/jobs", "/events", "/settings", "/metrics"):
            assert web.get(page).status_code == 200, page
        assert b'shingle_nfs_operations_total{op="read"} 3' in web.get("/metrics").data
        assert b'shingle_bands{state="open",class="warm"}' in web.get("/metrics").data
        from tests.webui.test_routes import add_huge_drive
        drive_id = add_huge_drive(live.catalog)
        bands = web.get(f"/api/v1/drives/{drive_id}").get_json()["bands"]
        assert bands == {"garbage": {"warm": 600}, "full": {"warm": 600, "cold": 600}, "empty": {"-": 4200}}
        assert "zones 1797-1799: 3 full, cold, 100% written" in web.get("/drives").get_data(as_text=True)
        assert os.path.exists(tmp_path / "webui-secret.key")
    finally:
        live.close()
