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
from tests.webui.conftest import FAKE_SMARTCTL, Browserish
from tests.webui.helpers import exists, make_checkpoints

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def fetch(url: str, method: str = "GET", body: bytes | None = None):
    request = urllib.request.Request(
        url, data=body, method=method, headers={"Content-Type": "application/json"} if body else {}
    )
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
    config_path.write_text(
        config_mod.render(
            {
                "appliance.data_dir": ".",
                "catalog.url": "sqlite:///catalog.db",
                "smart.smartctl": str(FAKE_SMARTCTL),
                "webui.workers": 1,
            }
        )
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "appliance.cli",
            "-c",
            str(config_path),
            "webui",
            "--port",
            str(port),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        first = proc.stdout.readline()
        assert (
            first.startswith(f"Web UI: http://127.0.0.1:{port}/")
            and "initial-admin-password" in first
        )
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
        status, _, body = fetch(
            base + "/api/v1/retention/rules", "POST", b'{"pattern": "/x/*", "keep": 1}'
        )
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
    config_path.write_text(
        config_mod.render({"appliance.data_dir": ".", "catalog.url": "sqlite:///missing.db"})
    )
    result = subprocess.run(
        [sys.executable, "-m", "appliance.cli", "-c", str(config_path), "webui"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "catalog at schema revision" in result.stderr


def test_web_ui_on_a_postgresql_catalog(postgres_server, tmp_path):
    from engine.admin import jobs, metrics
    from tests.webui.conftest import Live

    url = postgres_server.create_migrated_database()
    live = Live(url, tmp_path)
    try:
        web = Browserish(live.app.test_client())
        assert web.login().status_code == 302
        make_checkpoints(live.namespace, "/checkpoints/pg", range(1, 6), size=20_000)
        response = web.api(
            "POST", "/api/v1/retention/rules", {"pattern": "/checkpoints/*/step-*", "keep": 3}
        )
        assert response.status_code == 201
        preview = web.get("/api/v1/retention/preview").get_json()
        assert [p["path"] for p in preview] == ["/checkpoints/pg/step-1", "/checkpoints/pg/step-2"]
        job = web.api("POST", "/api/v1/retention/run", {}).get_json()
        assert jobs.wait(live.catalog, job["id"], timeout_s=30, poll_s=0.05).state == "done"
        assert not exists(live.namespace, "/checkpoints/pg/step-1") and exists(
            live.namespace, "/checkpoints/pg/step-3"
        )
        metrics.record_sample(live.catalog, nfs_read_bytes=1, nfs_write_bytes=2, nfs_ops_read=3)
        for page in (
            "/",
            "/drives",
            "/retention",
            "/exports",
            "/tiers",
            "/jobs",
            "/events",
            "/settings",
            "/metrics",
        ):
            assert web.get(page).status_code == 200, page
        assert b'shingle_nfs_operations_total{op="read"} 3' in web.get("/metrics").data
        assert b'shingle_bands{state="open",class="warm"}' in web.get("/metrics").data
        from tests.webui.test_routes import add_huge_drive

        drive_id = add_huge_drive(live.catalog)
        bands = web.get(f"/api/v1/drives/{drive_id}").get_json()["bands"]
        assert bands == {
            "garbage": {"warm": 600},
            "full": {"warm": 600, "cold": 600},
            "empty": {"-": 4200},
        }
        assert "zones 1797-1799: 3 full, cold, 100% written" in web.get("/drives").get_data(
            as_text=True
        )
        assert os.path.exists(tmp_path / "webui-secret.key")
    finally:
        live.close()


class HttpClient:
    """A real HTTP(S) client from a chosen source address, keeping the session cookie like a
    browser (no redirects followed, so Location headers can be checked)."""

    def __init__(self, port: int, source: str = "127.0.0.1", tls=None):
        self.port, self.source, self.tls = port, source, tls
        self.cookie: str | None = None
        self.csrf: str | None = None

    def request(
        self,
        method: str,
        path: str,
        form: dict | None = None,
        json_body=None,
        headers: dict | None = None,
    ):
        import http.client
        from urllib.parse import urlencode

        if self.tls is None:
            conn = http.client.HTTPConnection(
                "127.0.0.1", self.port, timeout=10, source_address=(self.source, 0)
            )
        else:
            conn = http.client.HTTPSConnection(
                "127.0.0.1",
                self.port,
                timeout=10,
                source_address=(self.source, 0),
                context=self.tls,
            )
        headers = dict(headers or {})
        body = None
        if form is not None:
            body = urlencode(form)
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        elif json_body is not None:
            body = json.dumps(json_body)
            headers["Content-Type"] = "application/json"
        if self.cookie:
            headers["Cookie"] = self.cookie
        try:
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            data = response.read()
        finally:
            conn.close()
        set_cookie = response.getheader("Set-Cookie")
        if set_cookie and set_cookie.startswith("shingle_session="):
            self.cookie = set_cookie.split(";", 1)[0]
        return response.status, response, data

    def login(self, username: str, password: str, next_path: str | None = None):
        from tests.webui.conftest import csrf_of

        _, _, page = self.request("GET", "/login")
        self.csrf = csrf_of(page.decode())
        path = "/login" + (f"?next={next_path}" if next_path else "")
        return self.request(
            "POST", path, form={"username": username, "password": password, "csrf_token": self.csrf}
        )


def start_webui(config_path: Path, port: int, tls=None) -> subprocess.Popen:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "appliance.cli",
            "-c",
            str(config_path),
            "webui",
            "--port",
            str(port),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            HttpClient(port, tls=tls).request("GET", "/login")
            return proc
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, "gunicorn did not start"
            time.sleep(0.2)


def stop_webui(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()  # never leave a server behind a failed test
        out, _ = proc.communicate()
    return out


def test_sign_in_security_over_real_http(template_catalog, tmp_path):
    """The web findings against gunicorn: open redirect, logout, back-off per address, scopes."""
    import shutil

    from engine.admin import accounts
    from engine.catalog import Catalog
    from engine.catalog.models import ApiToken
    from tests.webui.conftest import ADMIN, PASSWORD

    shutil.copyfile(template_catalog, tmp_path / "catalog.db")
    config_path = tmp_path / "shingle.toml"
    config_path.write_text(
        config_mod.render(
            {
                "appliance.data_dir": ".",
                "catalog.url": "sqlite:///catalog.db",
                "smart.smartctl": str(FAKE_SMARTCTL),
                "webui.workers": 2,
            }
        )
    )
    port = free_port()
    proc = start_webui(config_path, port)
    catalog = Catalog(f"sqlite:///{tmp_path}/catalog.db")
    try:
        # A tab inside "next" used to send the browser to //evil.example.
        browser = HttpClient(port)
        status, response, _ = browser.login(ADMIN, PASSWORD, next_path="%2F%09%2Fevil.example")
        assert status == 302 and response.getheader("Location") == "/"
        assert browser.request("GET", "/drives")[0] == 200
        stolen = browser.cookie
        assert "Secure" not in response.getheader("Set-Cookie")  # plain HTTP: no TLS, no Secure
        assert response.getheader("Strict-Transport-Security") is None
        assert browser.request("POST", "/logout", form={"csrf_token": browser.csrf})[0] == 302
        thief = HttpClient(port)
        thief.cookie = stolen
        status, response, _ = thief.request("GET", "/drives")
        assert status == 302 and response.getheader("Location").startswith("/login")

        # Guesses from 127.0.0.2 back it off; 127.0.0.1 signs in meanwhile; then 127.0.0.2 too.
        attacker, owner = HttpClient(port, source="127.0.0.2"), HttpClient(port)
        for _ in range(accounts.ACCOUNT_FROM_ADDRESS_FREE):
            assert attacker.login(ADMIN, "wrong password!")[0] == 401
        status, response, _ = attacker.login(ADMIN, "wrong password!")
        assert status == 429 and response.getheader("Retry-After") == "1"
        assert attacker.login(ADMIN, PASSWORD)[0] == 429
        assert owner.login(ADMIN, PASSWORD)[0] == 302
        time.sleep(1.1)
        assert attacker.login(ADMIN, PASSWORD)[0] == 302

        uid = catalog.read(lambda c: c.execute(accounts.USERS.select()).first().id)
        tokens = {
            scope: accounts.create_token(catalog, uid, scope, scope=scope, expires_s=3600)
            for scope in accounts.SCOPES
        }
        script = HttpClient(port)

        def api(scope, method, path, body=None):
            status, _, data = script.request(
                method, path, json_body=body, headers={"Authorization": f"Bearer {tokens[scope]}"}
            )
            return status, json.loads(data)

        assert api("read-only", "GET", "/api/v1/drives")[0] == 200
        status, body = api("read-only", "POST", "/api/v1/jobs", {"kind": "scrub"})
        assert status == 403 and "read-only" in body["error"]
        assert api("operator", "POST", "/api/v1/jobs", {"kind": "scrub"})[0] == 202
        wide_open = {"name": "/o", "squash": "no_root_squash"}
        assert api("operator", "POST", "/api/v1/exports", wide_open)[0] == 403
        more = {"name": "more", "scope": "admin"}
        assert api("operator", "POST", "/api/v1/tokens", more)[0] == 403
        assert api("admin", "POST", "/api/v1/tokens", {"name": "more", "scope": "admin"})[0] == 201
        catalog.run(
            lambda c: c.execute(ApiToken.__table__.update().values(expires_ns=time.time_ns() - 1))
        )
        status, body = api("admin", "GET", "/api/v1/drives")
        assert status == 401 and "expired" in body["error"]
    finally:
        catalog.close()
        out = stop_webui(proc)
    assert proc.returncode == 0, out


def test_init_tls_serves_https_with_secure_cookies_and_private_files(tmp_path):
    import ssl

    from tests.webui.conftest import csrf_of

    home = tmp_path / "appliance"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "appliance.cli",
            "init",
            str(home),
            "--tls",
            "--drive-size",
            "16MiB",
            "--zone-size",
            "1MiB",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "HTTPS:    self-signed certificate" in run.stdout
    for name in ("catalog.db", "initial-admin-password", "webui-secret.key", "webui-tls.key"):
        assert (home / name).stat().st_mode & 0o777 == 0o600, name
    config = config_mod.load(home / "shingle.toml")
    assert config.resolve("webui.tls_cert_file") == home / "webui-tls.crt"
    user, password = (home / "initial-admin-password").read_text().split()
    port = free_port()
    tls = ssl.create_default_context(cafile=str(home / "webui-tls.crt"))  # verified, not verify-off
    proc = start_webui(home / "shingle.toml", port, tls=tls)
    try:
        first = proc.stdout.readline()
        assert first.startswith(f"Web UI: https://127.0.0.1:{port}/")
        browser = HttpClient(port, tls=tls)
        status, response, _ = browser.login(user, password)
        assert status == 302
        cookie = response.getheader("Set-Cookie")
        assert "Secure" in cookie and "HttpOnly" in cookie
        assert response.getheader("Strict-Transport-Security") == "max-age=31536000"
        status, response, page = browser.request("GET", "/settings")
        assert status == 200 and csrf_of(page.decode())
        assert response.getheader("Strict-Transport-Security") == "max-age=31536000"
        try:
            plain = HttpClient(port).request("GET", "/login")[0]
        except OSError:  # the TLS server drops a plain request
            plain = None
        assert plain != 200  # no plain HTTP on the TLS port
    finally:
        out = stop_webui(proc)
    assert proc.returncode == 0, out
    for name in ("catalog.db-wal", "catalog.db-shm"):
        if (home / name).exists():
            assert (home / name).stat().st_mode & 0o777 == 0o600, name
