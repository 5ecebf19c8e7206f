"""One owner for the drives: the daemon holds an exclusive lock while it runs.

Admin commands that move data take the same lock to run in-process when no
daemon runs, and otherwise queue a job for the daemon (engine.jobs)."""
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
