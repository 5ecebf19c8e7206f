"""Delivery of alert notices (engine/admin/alerts.py) by mail and by webhook, off the caller's
thread.

``Notifier.deliver(notice)`` only puts the notice on each sink's bounded queue: the daemon's
maintenance loop never waits for a mail server or a webhook receiver. Each sink has one thread
that sends in order, with a timeout on every network call:
- ``MailSink``: SMTP (smtplib), STARTTLS when asked (refusing to send the password in clear:
  a server that offers no STARTTLS fails the delivery), AUTH with a password read from a file.
- ``WebhookSink``: a JSON POST; a failure (connection error, timeout, a status >= 300) is
  retried after ``backoff_s``, doubled each time, up to ``retries`` more attempts.
A notice that still fails is logged and dropped; so is one that finds its queue full."""

from __future__ import annotations

import json
import logging
import queue
import smtplib
import ssl
import threading
import time
import urllib.request
from collections.abc import Callable
from email.message import EmailMessage
from pathlib import Path
from typing import Any

log = logging.getLogger("shingle.notify")
QUEUE_SIZE = 1000


class Sink:
    name = "sink"

    def send(self, notice) -> None:
        raise NotImplementedError


class MailSink(Sink):
    name = "mail"

    def __init__(
        self,
        host: str,
        port: int,
        sender: str,
        recipients: list[str],
        *,
        username: str = "",
        password_file: str = "",
        starttls: bool = True,
        timeout_s: float = 10.0,
        tls_context: ssl.SSLContext | None = None,
    ):
        if not sender or not recipients:
            raise ValueError("mail alerts need alerts.mail_from and alerts.mail_to")
        self.host, self.port, self.sender, self.recipients = host, port, sender, recipients
        self.username, self.password_file = username, password_file
        self.starttls, self.timeout_s = starttls, timeout_s
        self.tls_context = tls_context or ssl.create_default_context()

    def message(self, notice) -> EmailMessage:
        msg = EmailMessage()
        msg["Subject"] = notice.subject
        msg["From"] = self.sender
        msg["To"] = ", ".join(self.recipients)
        alert = notice.alert
        lines = [
            alert.message,
            "",
            f"kind: {alert.kind}",
            f"severity: {alert.severity}",
            f"state: {notice.change}",
            f"alert id: {alert.id}",
        ]
        if alert.details:
            lines.append("details: " + json.dumps(alert.details, sort_keys=True, default=str))
        msg.set_content("\n".join(lines) + "\n")
        return msg

    def send(self, notice) -> None:
        with smtplib.SMTP(self.host, self.port, timeout=self.timeout_s) as smtp:
            smtp.ehlo()
            if self.starttls:
                smtp.starttls(context=self.tls_context)  # SMTPNotSupportedError if not offered
                smtp.ehlo()
            if self.username:
                password = (
                    Path(self.password_file).read_text().strip() if self.password_file else ""
                )
                smtp.login(self.username, password)
            smtp.send_message(self.message(notice))


class WebhookSink(Sink):
    name = "webhook"

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 5.0,
        retries: int = 4,
        backoff_s: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
    ):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"alerts.webhook_url = {url!r}: expected an http:// or https:// URL")
        self.url, self.timeout_s, self.retries, self.backoff_s = url, timeout_s, retries, backoff_s
        self.sleep = sleep

    def send(self, notice) -> None:
        body = json.dumps(
            {"source": "shingle", "subject": notice.subject, **notice.to_dict()}, default=str
        ).encode()
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            request = urllib.request.Request(
                self.url,
                data=body,
                method="POST",
                headers={"Content-Type": "application/json", "User-Agent": "shingle-alerts"},
            )
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    if response.status < 300:
                        return
                    failure = f"HTTP {response.status}"
            except Exception as exc:  # HTTPError (>= 400), URLError, timeouts
                failure = f"{exc.__class__.__name__}: {exc}"
            if attempt == self.retries:
                raise OSError(f"webhook {self.url}: {failure} after {attempt + 1} attempts")
            log.info("webhook %s: %s; retrying in %.1f s", self.url, failure, delay)
            self.sleep(delay)
            delay *= 2


class Notifier:
    """One queue and thread per sink; ``deliver`` never blocks."""

    def __init__(self, sinks: list[Sink]):
        self.sinks = sinks
        self.sent: dict[str, int] = {s.name: 0 for s in sinks}
        self.failed: dict[str, int] = {s.name: 0 for s in sinks}
        self._queues: list[queue.Queue] = [queue.Queue(QUEUE_SIZE) for _ in sinks]
        self._threads = [
            threading.Thread(
                target=self._run, args=(sink, q), daemon=True, name=f"shingle-notify-{sink.name}"
            )
            for sink, q in zip(sinks, self._queues, strict=True)
        ]
        for thread in self._threads:
            thread.start()

    def deliver(self, notice) -> None:
        for sink, q in zip(self.sinks, self._queues, strict=True):
            try:
                q.put_nowait(notice)
            except queue.Full:
                self.failed[sink.name] += 1
                log.error("%s alerts: queue full, notice dropped: %s", sink.name, notice.subject)

    def _run(self, sink: Sink, q: queue.Queue) -> None:
        while True:
            notice = q.get()
            if notice is None:
                q.task_done()
                return
            try:
                sink.send(notice)
                self.sent[sink.name] += 1
            except Exception as exc:
                self.failed[sink.name] += 1
                log.error("%s alert not delivered (%s): %s", sink.name, notice.subject, exc)
            finally:
                q.task_done()

    def wait_idle(self, timeout_s: float = 30.0) -> bool:
        """True once every queued notice was sent or given up (tests, shutdown)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(q.unfinished_tasks == 0 for q in self._queues):
                return True
            time.sleep(0.05)
        return False

    def stop(self, timeout_s: float = 10.0) -> None:
        for q in self._queues:
            try:
                q.put(None, timeout=1)
            except queue.Full:
                pass
        for thread in self._threads:
            thread.join(timeout_s)


def sinks_from_config(get: Callable[[str], Any], resolve: Callable[[str], Path]) -> list[Sink]:
    """The sinks ``[alerts]`` configures (mail when mail_host is set, webhook when its URL is)."""
    sinks: list[Sink] = []
    if get("alerts.mail_host"):
        password_file = get("alerts.mail_password_file")
        sinks.append(
            MailSink(
                str(get("alerts.mail_host")),
                int(get("alerts.mail_port")),
                str(get("alerts.mail_from")),
                [a.strip() for a in str(get("alerts.mail_to")).split(",") if a.strip()],
                username=str(get("alerts.mail_username")),
                password_file=str(resolve("alerts.mail_password_file")) if password_file else "",
                starttls=bool(get("alerts.mail_starttls")),
                timeout_s=float(get("alerts.mail_timeout_s")),
            )
        )
    if get("alerts.webhook_url"):
        sinks.append(
            WebhookSink(
                str(get("alerts.webhook_url")),
                timeout_s=float(get("alerts.webhook_timeout_s")),
                retries=int(get("alerts.webhook_retries")),
                backoff_s=float(get("alerts.webhook_backoff_s")),
            )
        )
    return sinks
