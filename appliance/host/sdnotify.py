"""sd_notify without libsystemd: READY/STATUS/WATCHDOG datagrams to $NOTIFY_SOCKET."""

from __future__ import annotations

import logging
import os
import socket
import threading


def notify(message: str) -> bool:
    """Send one notification; False when not run under systemd (no NOTIFY_SOCKET)."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # abstract socket namespace
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        sock.connect(address)
        sock.sendall(message.encode())
    return True


def watchdog_interval() -> float | None:
    """Half of systemd's WatchdogSec for this process, or None when no watchdog is asked for."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and int(pid) != os.getpid()):
        return None
    return int(usec) / 1e6 / 2


class Watchdog(threading.Thread):
    """Pings WATCHDOG=1 while ``healthy()`` says the daemon still serves."""

    def __init__(self, interval: float, healthy=lambda: True):
        super().__init__(name="sd-watchdog", daemon=True)
        self.interval, self.healthy = interval, healthy
        self.stopped = threading.Event()

    def run(self):
        while not self.stopped.wait(self.interval):
            try:
                healthy = self.healthy()
            except Exception:  # a broken probe must show in the log, not end the thread silently
                logging.getLogger("shingle.sdnotify").exception("watchdog health probe failed")
                healthy = False
            if healthy:
                notify("WATCHDOG=1")

    def stop(self):
        self.stopped.set()
