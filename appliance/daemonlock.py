"""One owner for the drives: the daemon holds an exclusive lock while it runs.

Admin commands that move data take the same lock to run in-process when no
daemon runs, and otherwise queue a job for the daemon (engine.admin.jobs)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class DrivesBusy(RuntimeError):
    pass


class DaemonLock:
    def __init__(self, data_dir: Path):
        self.path = Path(data_dir) / "shingle.lock"
        self.fd: int | None = None

    def acquire(self) -> bool:
        """True if we now own the drives; False if another process does."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return True

    def holder(self) -> str:
        try:
            return self.path.read_text().strip() or "unknown"
        except OSError:
            return "unknown"

    def holder_pid(self) -> int | None:
        try:
            return int(self.path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def holder_gone(self) -> str | None:
        """Why the process named in the lock file no longer runs (None: it runs, or no pid yet).

        Read-only on purpose: probing with flock could make a daemon that starts at that moment
        think the drives are taken."""
        pid = self.holder_pid()
        if pid is None:
            return None
        if not process_alive(pid):
            return f"the daemon (pid {pid}) has stopped"
        return None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self):
        if not self.acquire():
            raise DrivesBusy(f"the drives are in use by process {self.holder()} ({self.path})")
        return self

    def __exit__(self, *exc):
        self.release()


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by its parent, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists under another user
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: kill(0) is all we know
    return stat[stat.rindex(")") + 2 :].split()[0] not in ("Z", "X")
