"""Alerts end to end: sources over a real catalog, states, and delivery to a real SMTP server
(aiosmtpd, with STARTTLS and AUTH) and a real HTTP receiver that fails the first attempt."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from pgserver import free_port
from sqlalchemy import update
from sqlalchemy.exc import OperationalError

from engine.admin import jobs
from engine.admin.alerts import (
    AlertMonitor,
    AlertService,
    AlertSettings,
    Capacity,
    CertificateExpiry,
    DriveFailed,
    JobFailed,
    SmartHealth,
)
from engine.admin.notify import MailSink, Notifier, WebhookSink
from engine.catalog.models import Drive, Zone
from engine.drives import format_emulated
from engine.lifecycle import drives as drive_states

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "smart"


@pytest.fixture
def drives(sqlite_catalog, tmp_path):
    ids = format_emulated(
        sqlite_catalog, tmp_path / "drives", 3, 8 * 65536, 65536, preallocate=False
    )
    yield ids
    shutil.rmtree(tmp_path / "drives", ignore_errors=True)


def states(catalog, kind):
    return [(a.key, a.state) for a in AlertService(catalog).list() if a.kind == kind]


def test_a_failed_drive_is_raised_acknowledged_and_cleared(sqlite_catalog, drives):
    seen = []
    monitor = AlertMonitor(
        sqlite_catalog, AlertSettings(), deliver=seen.append, sources=[DriveFailed()]
    )
    assert monitor.tick(force=True) == []
    drive_states.fail_drive(sqlite_catalog, drives[1], actor="admin")
    [raised] = monitor.tick(force=True)
    assert raised.change == "active" and raised.alert.key == f"drive:{drives[1]}"
    assert "failed" in raised.alert.message and seen == [raised]
    service = AlertService(sqlite_catalog)
    acked = service.acknowledge(raised.alert.id, "admin")
    assert acked.state == "acknowledged" and acked.acknowledged_by == "admin"
    assert monitor.tick(force=True) == []  # still true: stays acknowledged, nothing new sent
    with pytest.raises(Exception, match="only an active alert"):
        service.acknowledge(raised.alert.id, "admin")
    drive_states.set_drive_state(sqlite_catalog, drives[1], "removed")
    [cleared] = monitor.tick(force=True)
    assert cleared.change == "cleared" and cleared.alert.id == raised.alert.id
    assert states(sqlite_catalog, "drive_failed") == [(f"drive:{drives[1]}", "cleared")]


def test_capacity_thresholds_and_failed_jobs(sqlite_catalog, drives):
    settings = AlertSettings(
        capacity_warn_percent=80, capacity_critical_percent=90, reserve_zones=0
    )
    monitor = AlertMonitor(sqlite_catalog, settings, sources=[Capacity(), JobFailed()])

    def fill(share):
        zones = Zone.__table__
        sqlite_catalog.run(
            lambda c: c.execute(update(zones).values(write_pointer=int(65536 * share)))
        )

    fill(0.85)
    monitor.tick(force=True)
    assert states(sqlite_catalog, "capacity") == [("80%", "active")]
    fill(0.95)
    monitor.tick(force=True)
    assert sorted(states(sqlite_catalog, "capacity")) == [("80%", "cleared"), ("90%", "active")]
    fill(0.1)
    monitor.tick(force=True)
    assert {s for _k, s in states(sqlite_catalog, "capacity")} == {"cleared"}

    job = jobs.submit(sqlite_catalog, "scrub", {})
    jobs.claim(sqlite_catalog, job)
    jobs.finish(sqlite_catalog, job, ok=False, message="IOFailure: drive 2 gone")
    monitor.tick(force=True)
    assert states(sqlite_catalog, "job_failed") == [(f"job:{job}", "active")]
    again = jobs.submit(sqlite_catalog, "scrub", {})
    jobs.claim(sqlite_catalog, again)
    jobs.finish(sqlite_catalog, again, ok=True, result={"unrepairable": 0})
    monitor.tick(force=True)
    assert states(sqlite_catalog, "job_failed") == [(f"job:{job}", "cleared")]


def test_smart_prefail_and_temperature(sqlite_catalog, drives, tmp_path, monkeypatch):
    report = json.loads((FIXTURES / "sda.json").read_text())
    report["smart_status"] = {"passed": False}
    report["temperature"] = {"current": 63}
    fixtures = tmp_path / "smart"
    fixtures.mkdir()
    (fixtures / "sda.json").write_text(json.dumps(report))
    monkeypatch.setenv("FAKE_SMARTCTL_DIR", str(fixtures))
    table = Drive.__table__
    sqlite_catalog.run(
        lambda c: c.execute(update(table).where(table.c.id == drives[0]).values(device="/dev/sda"))
    )
    settings = AlertSettings(temperature_c=55, smartctl=str(FIXTURES / "fake_smartctl"))
    AlertMonitor(sqlite_catalog, settings, sources=[SmartHealth()]).tick(force=True)
    found = {a.key: a for a in AlertService(sqlite_catalog).list()}
    assert set(found) == {f"prefail:drive:{drives[0]}", f"temperature:drive:{drives[0]}"}
    assert found[f"prefail:drive:{drives[0]}"].severity == "critical"
    assert "63 °C" in found[f"temperature:drive:{drives[0]}"].message


def test_a_certificate_near_expiry(sqlite_catalog, tmp_path):
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "5",
            "-subj",
            "/CN=127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    settings = AlertSettings(cert_file=str(cert), cert_warn_days=21)
    monitor = AlertMonitor(sqlite_catalog, settings, sources=[CertificateExpiry()])
    [notice] = monitor.tick(force=True)
    assert notice.alert.kind == "cert_expiry" and "expires in" in notice.alert.message
    settings.cert_warn_days = 2
    [cleared] = AlertMonitor(sqlite_catalog, settings, sources=[CertificateExpiry()]).tick(
        force=True
    )
    assert cleared.change == "cleared"


class FlakyCatalog:
    """The catalog going away is a fault a test cannot cause on SQLite: reads fail while down."""

    def __init__(self, catalog):
        self.catalog, self.down = catalog, False

    def read(self, work):
        if self.down:
            raise OperationalError("SELECT 1", {}, Exception("connection refused"))
        return self.catalog.read(work)

    def __getattr__(self, name):
        return getattr(self.catalog, name)


def test_catalog_unreachable_is_sent_then_recorded_cleared(sqlite_catalog):
    seen = []
    flaky = FlakyCatalog(sqlite_catalog)
    monitor = AlertMonitor(flaky, AlertSettings(), deliver=seen.append, sources=[])
    flaky.down = True
    monitor.tick(force=True)
    monitor.tick(force=True)  # told once
    assert [(n.alert.kind, n.change) for n in seen] == [("catalog_unreachable", "active")]
    flaky.down = False
    monitor.tick(force=True)
    assert [(n.alert.kind, n.change) for n in seen][-1] == ("catalog_unreachable", "cleared")
    assert states(sqlite_catalog, "catalog_unreachable") == [("", "cleared")]


# -- delivery -------------------------------------------------------------------------------------
@pytest.fixture
def smtp_server(tmp_path):
    """aiosmtpd on 127.0.0.1 that requires STARTTLS and AUTH (user alerts, password s3cret)."""
    from aiosmtpd.controller import Controller
    from aiosmtpd.smtp import AuthResult

    from appliance.host.tls import make_self_signed

    cert, key = tmp_path / "smtp.crt", tmp_path / "smtp.key"
    make_self_signed(cert, key, ["127.0.0.1", "localhost"])
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)

    class Inbox:
        def __init__(self):
            self.messages, self.logins = [], []
            self.got = threading.Event()

        async def handle_DATA(self, server, session, envelope):
            self.messages.append(
                (
                    session.authenticated,
                    envelope.mail_from,
                    envelope.rcpt_tos,
                    envelope.content.decode(),
                )
            )
            self.got.set()
            return "250 OK"

    def authenticator(server, session, envelope, mechanism, auth_data):
        inbox.logins.append((mechanism, auth_data.login))
        return AuthResult(success=auth_data.login == b"alerts" and auth_data.password == b"s3cret")

    inbox = Inbox()
    controller = Controller(
        inbox,
        hostname="127.0.0.1",
        port=free_port(),
        tls_context=server_tls,
        require_starttls=True,
        auth_required=True,
        auth_require_tls=True,
        authenticator=authenticator,
    )
    controller.start()
    password = tmp_path / "smtp-password"
    password.write_text("s3cret\n")
    yield controller, inbox, ssl.create_default_context(cafile=str(cert)), password
    controller.stop()


class Receiver(BaseHTTPRequestHandler):
    fail_first = 1
    bodies: list = []
    attempts = 0

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        cls = type(self)
        cls.attempts += 1
        if cls.attempts <= cls.fail_first:
            self.send_response(503)
            self.end_headers()
            return
        cls.bodies.append(body)
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def webhook():
    Receiver.bodies, Receiver.attempts = [], 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", Receiver
    server.shutdown()
    server.server_close()


def test_alerts_reach_a_real_smtp_server_and_a_webhook(
    sqlite_catalog, drives, smtp_server, webhook
):
    controller, inbox, client_tls, password = smtp_server
    url, receiver = webhook
    mail = MailSink(
        "127.0.0.1",
        controller.port,
        "shingle@example.test",
        ["ops@example.test", "oncall@example.test"],
        username="alerts",
        password_file=str(password),
        starttls=True,
        timeout_s=5,
        tls_context=client_tls,
    )
    hook = WebhookSink(url, timeout_s=5, retries=3, backoff_s=0.05)
    notifier = Notifier([mail, hook])
    monitor = AlertMonitor(
        sqlite_catalog, AlertSettings(), deliver=notifier.deliver, sources=[DriveFailed()]
    )
    try:
        drive_states.fail_drive(sqlite_catalog, drives[2], actor="admin")
        [raised] = monitor.tick(force=True)
        assert notifier.wait_idle(30)
        drive_states.set_drive_state(sqlite_catalog, drives[2], "removed")
        [cleared] = monitor.tick(force=True)
        assert notifier.wait_idle(30)
    finally:
        notifier.stop()
    assert notifier.failed == {"mail": 0, "webhook": 0}
    assert [m[0] for m in inbox.messages] == [True, True]  # sent after AUTH, hence after STARTTLS
    assert inbox.logins and all(login == b"alerts" for _m, login in inbox.logins)
    first, second = inbox.messages
    assert first[1] == "shingle@example.test" and first[2] == [
        "ops@example.test",
        "oncall@example.test",
    ]
    assert f"[shingle CRITICAL] drive {drives[2]} is failed" in first[3]
    assert "[shingle CLEARED]" in second[3] and "state: cleared" in second[3]
    # the receiver refused the first POST: the sink retried, and both notices arrived in order
    assert receiver.attempts == 3
    assert [(b["change"], b["id"], b["kind"]) for b in receiver.bodies] == [
        ("active", raised.alert.id, "drive_failed"),
        ("cleared", raised.alert.id, "drive_failed"),
    ]
    assert receiver.bodies[0]["state"] == "active" and receiver.bodies[1]["cleared_ns"]


def test_mail_without_starttls_on_offer_is_refused_not_sent_in_clear(sqlite_catalog, tmp_path):
    from aiosmtpd.controller import Controller

    class Inbox:
        messages = []

        async def handle_DATA(self, server, session, envelope):
            self.messages.append(envelope)
            return "250 OK"

    controller = Controller(Inbox(), hostname="127.0.0.1", port=free_port())
    controller.start()
    try:
        mail = MailSink(
            "127.0.0.1",
            controller.port,
            "a@example.test",
            ["b@example.test"],
            starttls=True,
            timeout_s=5,
        )
        notifier = Notifier([mail])
        from engine.admin.alerts import AlertRecord, Notice

        notice = Notice(
            AlertRecord(
                1, "capacity", "80%", "warning", "active", "full", {}, 1, 1, None, None, None
            ),
            "active",
        )
        notifier.deliver(notice)
        assert notifier.wait_idle(20)
        notifier.stop()
    finally:
        controller.stop()
    assert notifier.failed == {"mail": 1} and Inbox.messages == []


def test_a_dead_webhook_does_not_hold_up_the_caller(sqlite_catalog):
    import time

    hook = WebhookSink(
        f"http://127.0.0.1:{free_port()}/gone", timeout_s=1, retries=2, backoff_s=0.2
    )
    notifier = Notifier([hook])
    from engine.admin.alerts import AlertRecord, Notice

    started = time.monotonic()
    for n in range(5):
        notifier.deliver(
            Notice(
                AlertRecord(
                    n, "capacity", "", "warning", "active", "x", {}, 1, 1, None, None, None
                ),
                "active",
            )
        )
    assert time.monotonic() - started < 0.2
    assert notifier.wait_idle(30)
    notifier.stop()
    assert notifier.failed == {"webhook": 5}
