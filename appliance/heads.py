"""`shingle serve --heads N`: N head processes behind one NFS port (docs/heads.md).

The process `shingle serve` runs holds the data folder's daemon lock, listens on the NFS port
(and on the port mapper's, when it is served) and hands each accepted connection to the head
its client's address picks (appliance/nfs/handoff.py): a whole `shingle serve` of its own,
started as a child with [heads] count = N and index = i, so each appends only its own zones
and head 0 alone runs maintenance (docs/pnfs.md). The web UI is this process's child. A head
that dies is started again under its index; connections for it wait here (up to
PENDING_MAX_S) until it serves again. SIGTERM stops every head (each stops as `shingle serve`
does), then the listener.

``heads.json`` in the data folder says who serves: `shingle status` and `shingle doctor` read
it."""

from __future__ import annotations

import json
import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from appliance.config import Config, etcd_endpoints
from appliance.daemonlock import DaemonLock, process_alive
from appliance.host.addresses import listening_socket
from appliance.nfs import portmap as pmap
from appliance.nfs.handoff import READY, TAKEN, channel_pair, hand_over, head_for

log = logging.getLogger("shingle.heads")

STATUS_FILE = "heads.json"
PENDING_MAX_S = 60.0  # a connection waits this long for its head to serve (again)
PENDING_MAX = 256  # connections waiting per head; the oldest is closed beyond
RESTART_BACKOFF_S = (0.0, 1.0, 2.0, 5.0, 10.0, 30.0)  # after 1, 2, ... quick deaths in a row
QUICK_DEATH_S = 30.0  # a head that dies sooner after its start counts towards the back-off
STOP_WAIT_S = 120.0  # for the heads to stop on SIGTERM (each waits for its maintenance job)


class HeadsError(Exception):
    """`--heads` cannot run with this configuration, or a head could not start."""


def check_config(config: Config, count: int) -> None:
    """Why ``config`` cannot be served by ``count`` heads behind one port (HeadsError)."""
    if count < 1:
        raise HeadsError(f"--heads {count}: at least 1")
    if count > 256:
        raise HeadsError(f"--heads {count}: at most 256 (heads.count's limit)")
    if count == 1:
        return
    if config.get("heads.count") != 1:
        raise HeadsError(
            f"--heads {count} with heads.count = {config.get('heads.count')} in "
            f"{config.path}: --heads runs its own heads on this host; leave heads.count at 1 "
            "or run each head as its own `shingle serve`"
        )
    if config.get("pnfs.role") != "off":
        raise HeadsError(
            f"--heads {count} with pnfs.role = {config.get('pnfs.role')}: a pNFS metadata or "
            "data server is one head with its own address; set pnfs.role = off or leave "
            "--heads out"
        )
    if etcd_endpoints(config.get("cluster.etcd_endpoints")):
        raise HeadsError(
            f"--heads {count} with cluster.etcd_endpoints set: a cluster host runs one head "
            "(its maintenance campaigns for leader); leave --heads out"
        )


def head_config(config: Config, index: int, count: int, portmap: str, portmap_port: int) -> Config:
    """``config`` as head ``index`` of ``count`` sees it."""
    values = dict(config.values)
    values.update(
        {
            "heads.count": count,
            "heads.index": index,
            "nfs.portmap": portmap,
            "nfs.portmap_port": portmap_port,
        }
    )
    return Config(values, config.band_classes, config.path)


def head_lock_dir(data_dir: Path, index: int) -> Path:
    """Where head ``index`` keeps its daemon lock (two heads of one index never run)."""
    path = Path(data_dir) / "heads" / str(index)
    path.mkdir(parents=True, exist_ok=True)
    return path


def read_status(data_dir: Path) -> dict | None:
    """What ``heads.json`` says, if its listener still runs; else None."""
    try:
        status = json.loads((Path(data_dir) / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(status, dict) or not process_alive(int(status.get("pid") or 0)):
        return None
    for head in status.get("heads", []):
        head["alive"] = bool(head.get("pid")) and process_alive(int(head["pid"]))
    return status


@dataclass
class Head:
    index: int
    proc: subprocess.Popen | None = None
    channel: socket.socket | None = None
    ready: bool = False
    started_at: float = 0.0
    restarts: int = 0
    quick_deaths: int = 0
    next_start: float = 0.0
    handed: int = 0  # connections handed over, all lives together
    served: bool = False  # it said READY once (a head that never did is not restarted)
    pending: deque = field(default_factory=deque)  # (accepted socket, monotonic time)
    sent: deque = field(default_factory=deque)  # handed over, not yet TAKEN: ours to keep
    last_exit: int | None = None


class Heads:
    """The listener and its heads. ``run(stop)`` serves until ``stop`` is set (0) or a head
    fails before it ever served (1)."""

    def __init__(
        self,
        config: Config,
        count: int,
        *,
        nfs_port: int | None = None,
        web_port: int | None = None,
        web: bool = True,
        announce=lambda line: print(line, flush=True),
    ):
        self.config = config
        self.count = count
        self.host = config.get("nfs.host")
        self.port = nfs_port if nfs_port is not None else config.get("nfs.port")
        # the web UI is the listener's child, not a head's: a head killed outright would leave
        # it holding its port, and the head's next start would fail on it
        self.web_port = web_port if web_port is not None else config.get("webui.port")
        self.with_web = web
        self.web: subprocess.Popen | None = None
        self.announce = announce
        self.lock = DaemonLock(config.data_dir)
        self.heads = [Head(i) for i in range(count)]
        self.selector = selectors.DefaultSelector()
        self.listeners: list[socket.socket] = []
        self.portmap_mode = "off"
        self.portmap_port = config.get("nfs.portmap_port")
        self.registered = False
        self.status_path = config.data_dir / STATUS_FILE

    # -- start and stop ------------------------------------------------------------------
    def run(self, stop: threading.Event) -> int:
        from appliance.runtime import DaemonBusy

        if not self.lock.acquire():
            raise DaemonBusy(
                f"another shingle daemon (pid {self.lock.holder()}) serves {self.config.data_dir}"
            )
        try:
            self.listen()
            for head in self.heads:
                self.start_head(head)
            if self.with_web:
                self.web = subprocess.Popen(
                    [sys.executable, "-m", "appliance.cli", "-c", str(self.config.path)]
                    + ["webui", "--port", str(self.web_port)]
                )
            return self.serve(stop)
        finally:
            self.stop()

    def listen(self) -> None:
        nfs = self._bind(self.host, self.port)
        self.port = nfs.getsockname()[1]
        mode = self.config.get("nfs.portmap")
        if mode == "auto":
            answers = self.portmap_port and pmap.rpcbind_answers("127.0.0.1", self.portmap_port)
            mode = "register" if answers else "serve"
        if mode == "serve":
            try:
                pm = self._bind(self.host, self.portmap_port)
                self.portmap_port = pm.getsockname()[1]
                mode = "handed"
            except OSError as exc:
                log.warning(
                    "port mapper not served on port %d (%s): NFSv3 clients then need nolock",
                    self.portmap_port,
                    exc,
                )
                mode = "off"
        self.portmap_mode = mode
        log.info("listening on %s:%d for %d heads", self.host, self.port, self.count)

    def _bind(self, host: str, port: int) -> socket.socket:
        sock = listening_socket(host, port)
        self.listeners.append(sock)
        self.selector.register(sock, selectors.EVENT_READ, ("listen", None))
        return sock

    def head_command(self, head: Head, fd: int) -> list[str]:
        cmd = [sys.executable, "-m", "appliance.cli", "-c", str(self.config.path), "serve"]
        cmd += ["--nfs-port", str(self.port), "--head", f"{head.index}/{self.count}"]
        # a head of index 0 registers with a system rpcbind; "handed": the listener serves it
        portmap = self.portmap_mode
        if portmap == "register" and head.index != 0:
            portmap = "off"
        cmd += ["--handoff-fd", str(fd), "--portmap", f"{portmap}:{self.portmap_port}"]
        return [*cmd, "--no-web"]

    def start_head(self, head: Head) -> None:
        mine, theirs = channel_pair()
        # systemd's readiness and watchdog are the listener's: a head must not answer for it
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
        }
        try:
            head.proc = subprocess.Popen(
                self.head_command(head, theirs.fileno()), pass_fds=(theirs.fileno(),), env=env
            )
        finally:
            theirs.close()
        mine.setblocking(False)
        head.channel, head.ready = mine, False
        head.started_at = time.monotonic()
        self.selector.register(mine, selectors.EVENT_READ, ("head", head))
        log.info("head %d started (pid %d)", head.index, head.proc.pid)
        self.write_status()

    def stop(self) -> None:
        """SIGTERM to every head (and the web UI), then wait for them (SIGKILL after
        STOP_WAIT_S)."""
        procs = [h.proc for h in self.heads if h.proc is not None and h.proc.poll() is None]
        if self.web is not None and self.web.poll() is None:
            procs.append(self.web)
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT_S
        for proc in procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("head pid %d did not stop in %.0f s: killed", proc.pid, STOP_WAIT_S)
                proc.kill()
                proc.wait()
        for head in self.heads:
            self._drop_channel(head)
            while head.pending:
                head.pending.popleft()[0].close()
        for sock in self.listeners:
            self.selector.unregister(sock)
            sock.close()
        self.listeners = []
        self.selector.close()
        try:
            self.status_path.unlink()
        except OSError:
            pass
        self.lock.release()
        log.info("stopped")

    # -- serving ---------------------------------------------------------------------------
    def serve(self, stop: threading.Event) -> int:
        from appliance.host.sdnotify import notify, watchdog_interval

        announced = False
        watchdog, pinged = watchdog_interval(), 0.0  # systemd's, when the unit asks for one
        while not stop.is_set():
            for key, _events in self.selector.select(timeout=0.5):
                kind, head = key.data
                if kind == "listen":
                    self.accept(key.fileobj)
                else:
                    self.hear(head)
            now = time.monotonic()
            for head in self.heads:
                failed = self.watch_head(head, now)
                if failed:
                    return 1
                self.flush(head, now)
            if self.web is not None and self.web.poll() is not None:
                log.error("web UI exited with status %s; stopping", self.web.returncode)
                return 1
            if not announced and all(h.ready for h in self.heads):
                announced = True
                self.ready()
            if watchdog is not None and announced and now - pinged >= watchdog:
                pinged = now  # this loop runs: heads that die are started again by it
                notify("WATCHDOG=1")
        return 0

    def ready(self) -> None:
        from appliance.host.addresses import client_addresses, url_host, wildcard_note
        from appliance.host.sdnotify import notify

        addresses = client_addresses(self.host)
        shown, port = url_host(addresses[0]), self.port
        self.announce(
            f"NFS:    nfs://{shown}:{port}/export?version=4.1   ({self.count} heads)"
            + wildcard_note(self.host, addresses)
        )
        self.announce(
            "        mount -t nfs -o "
            f"vers=4.1,port={port},nconnect=4,rsize=1048576,wsize=1048576 "
            f"{shown}:/export /mnt/shingle"
        )
        notify("READY=1\nSTATUS=serving")

    def accept(self, listener) -> None:
        for _ in range(64):  # a burst at a time; the rest at the next select
            try:
                conn, peer = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and the like: the client retries
                log.warning("accept failed: %s", exc)
                return
            head = self.heads[head_for(peer[0], self.count)]
            head.pending.append((conn, time.monotonic()))
            if len(head.pending) > PENDING_MAX:
                head.pending.popleft()[0].close()
            self.flush(head, time.monotonic())

    def flush(self, head: Head, now: float) -> None:
        """Hand ``head`` its waiting connections while it serves; drop those waited too long."""
        while head.pending:
            conn, since = head.pending[0]
            if not head.ready or head.channel is None:
                if now - since > PENDING_MAX_S:
                    head.pending.popleft()
                    conn.close()
                    continue
                return
            try:
                hand_over(head.channel, conn)
            except BlockingIOError:
                return  # the head's queue is full: try again at the next round
            except OSError as exc:
                log.warning("head %d did not take a connection: %s", head.index, exc)
                self._drop_channel(head)
                return
            head.sent.append(head.pending.popleft())
            head.handed += 1

    def hear(self, head: Head) -> None:
        assert head.channel is not None
        try:
            msg = head.channel.recv(64)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            msg = b""
        if msg == TAKEN:
            if head.sent:
                head.sent.popleft()[0].close()
        elif msg == READY:
            head.ready = head.served = True
            log.info("head %d serves", head.index)
            self.write_status()
            self.flush(head, time.monotonic())
        elif not msg:  # the head's end closed: it is gone or going
            self._drop_channel(head)

    def watch_head(self, head: Head, now: float) -> bool:
        """Start ``head`` again once it exited; True when it never served at all (a
        configuration or start-up problem no restart fixes: the listener stops)."""
        proc = head.proc
        if proc is None:
            if now >= head.next_start:
                head.restarts += 1
                self.start_head(head)
            return False
        code = proc.poll()
        if code is None:
            return False
        self._drop_channel(head)
        head.proc, head.last_exit = None, code
        if not head.served:
            log.error("head %d exited with status %s before it served; stopping", head.index, code)
            return True
        quick = now - head.started_at < QUICK_DEATH_S
        head.quick_deaths = head.quick_deaths + 1 if quick else 0
        delay = RESTART_BACKOFF_S[min(head.quick_deaths, len(RESTART_BACKOFF_S) - 1)]
        # back before the other heads expire it (a lease of silence) and take its clients,
        # who would still be sent here
        delay = min(delay, self.config.get("nfs.lease_seconds") / 3)
        head.next_start = now + delay
        log.error(
            "head %d (pid %d) exited with status %s; starting it again in %.0f s",
            head.index,
            proc.pid,
            code,
            delay,
        )
        self.write_status()
        return False

    def _drop_channel(self, head: Head) -> None:
        head.ready = False
        # what the head never took waits for its next instance, first in line
        head.pending.extendleft(reversed(head.sent))
        head.sent.clear()
        if head.channel is not None:
            self.selector.unregister(head.channel)
            head.channel.close()
            head.channel = None

    def write_status(self) -> None:
        status = {
            "pid": os.getpid(),
            "host": self.host,
            "port": self.port,
            "portmap": self.portmap_mode,
            "portmap_port": self.portmap_port,
            "count": self.count,
            "heads": [
                {
                    "index": h.index,
                    "pid": h.proc.pid if h.proc is not None else None,
                    "serving": h.ready,
                    "restarts": h.restarts,
                    "last_exit": h.last_exit,
                    "started": time.time() - (time.monotonic() - h.started_at),
                }
                for h in self.heads
            ],
        }
        tmp = self.status_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(status, indent=1))
        os.replace(tmp, self.status_path)
