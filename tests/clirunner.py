"""`python -m appliance.cli ARGS` for the tests, each run a process of its own, without paying for
the interpreter's start and the CLI's imports each time.

A fresh `python -m appliance.cli` spends about two thirds of its CPU (0.45 of 0.66 s for a
`shingle snapshot list`, more on a loaded machine) starting the interpreter and importing
SQLAlchemy, Alembic and the engine before its command runs; the CLI tests run hundreds. Here a
zygote process started once per test run (cwd = the repository, the test run's environment, as
the tests' subprocesses had) imports `appliance.cli` and forks a child per command; the child
takes the caller's stdin, stdout and stderr (passed over a Unix socket), working folder and
environment, and runs the package's __main__ with `runpy` as `-m` does, so argv, exit code,
output and the interpreter's exit (atexit, threads, an uncaught exception's traceback) are a
fresh process's. A command the zygote cannot run as a fresh process would (another working
folder, or an environment that differs in what is read at start-up, such as PYTHONPATH or
SHINGLE_NATIVE) runs as a plain subprocess.

    run(["-c", conf, "snapshot", "list", "/"], input=None, timeout=60) -> CompletedProcess
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# read when a command runs, not when the interpreter starts or the CLI is imported: a request may
# differ from the zygote's environment in these and still be run by it
RUNTIME_ONLY = frozenset({"PYTEST_CURRENT_TEST", "SHINGLE_CONFIG"})


def run(
    args: list[str],
    *,
    input: str | None = None,
    cwd: str | Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess:
    """What `subprocess.run([sys.executable, "-m", "appliance.cli", *args], capture_output=True,
    text=True, cwd=cwd or REPO, ...)` returns."""
    env = dict(os.environ if env is None else env)
    zygote = _zygote(env) if cwd is None or Path(cwd).resolve() == REPO else None
    if zygote is None:
        return subprocess.run(
            [sys.executable, "-m", "appliance.cli", *args],
            input=input,
            capture_output=True,
            text=True,
            cwd=cwd or REPO,
            env=env,
            timeout=timeout,
        )
    return zygote.run([str(a) for a in args], input, env, timeout)


class Zygote:
    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="shingle-cli-zygote-"))
        self.path = self.folder / "socket"
        self.env = dict(os.environ)
        self.lock = threading.Lock()  # one command at a time: the zygote waits for each child
        self.log = self.folder / "zygote.log"  # its own output; each child has the caller's
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, __file__, str(self.path)],
                cwd=REPO,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        deadline = time.monotonic() + 120
        while not self.path.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the CLI zygote did not start: {self.log.read_text()[-3000:]}")
            time.sleep(0.02)

    def serves(self, env: dict[str, str]) -> bool:
        if self.proc.poll() is not None:
            return False
        keys = (set(env) | set(self.env)) - RUNTIME_ONLY
        return all(env.get(k) == self.env.get(k) for k in keys)

    def run(
        self, args: list[str], input: str | None, env: dict[str, str], timeout: float | None
    ) -> subprocess.CompletedProcess:
        with self.lock:
            return self._run(args, input, env, timeout)

    def _run(
        self, args: list[str], input: str | None, env: dict[str, str], timeout: float | None
    ) -> subprocess.CompletedProcess:
        deadline = None if timeout is None else time.monotonic() + timeout
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        stderr_r, stderr_w = os.pipe()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(str(self.path))
            request = json.dumps({"argv": args, "env": env}).encode()
            socket.send_fds(conn, [request], [stdin_r, stdout_w, stderr_w])
        finally:
            for fd in (stdin_r, stdout_w, stderr_w):
                os.close(fd)
        replies = conn.makefile("r")
        pid = int(json.loads(replies.readline())["pid"])
        try:
            out, err = _communicate(stdin_w, stdout_r, stderr_r, (input or "").encode(), deadline)
            if out is None:  # timed out: as subprocess.run, kill it and say so
                raise subprocess.TimeoutExpired(
                    [sys.executable, "-m", "appliance.cli", *args], timeout or 0
                )
            status = int(json.loads(replies.readline())["status"])
        except BaseException:
            # timed out, or the test was stopped (pytest-timeout, ^C): the zygote waits for its
            # child before it takes the next command, so the child must not outlive the call
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
            raise
        finally:
            conn.close()
        return subprocess.CompletedProcess(
            [sys.executable, "-m", "appliance.cli", *args],
            os.waitstatus_to_exitcode(status),
            out.decode(errors="replace"),
            (err or b"").decode(errors="replace"),
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def _communicate(
    stdin_w: int, stdout_r: int, stderr_r: int, data: bytes, deadline: float | None
) -> tuple[bytes | None, bytes | None]:
    """Writes DATA to stdin and reads stdout and stderr to their ends; (None, None) at DEADLINE."""
    chunks: dict[int, list[bytes]] = {stdout_r: [], stderr_r: []}
    pending = memoryview(data)
    sel = selectors.DefaultSelector()
    try:
        if pending:
            os.set_blocking(stdin_w, False)
            sel.register(stdin_w, selectors.EVENT_WRITE)
        else:
            os.close(stdin_w)
            stdin_w = -1
        for fd in chunks:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None, None
            for key, _ in sel.select(left):
                if key.fd == stdin_w:
                    try:
                        pending = pending[os.write(stdin_w, pending) :]
                    except BrokenPipeError:
                        pending = pending[:0]
                    if not pending:
                        sel.unregister(stdin_w)
                        os.close(stdin_w)
                        stdin_w = -1
                    continue
                block = os.read(key.fd, 1 << 16)
                if block:
                    chunks[key.fd].append(block)
                else:
                    sel.unregister(key.fd)
        return b"".join(chunks[stdout_r]), b"".join(chunks[stderr_r])
    finally:
        sel.close()
        for fd in (stdin_w, stdout_r, stderr_r):
            if fd >= 0:
                os.close(fd)


_started: list[Zygote] = []


def _zygote(env: dict[str, str]) -> Zygote | None:
    if not _started or _started[0].proc.poll() is not None:
        if _started:
            _started.pop().stop()
        _started.append(Zygote())
        atexit.register(_started[0].stop)
    zygote = _started[0]
    return zygote if zygote.serves(env) else None


def _serve(path: str) -> list[str] | None:
    """The zygote's loop; returns (in a forked child only) the argv the child is to run."""
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".new")
    listener.listen(8)
    listener.settimeout(5)
    os.rename(path + ".new", path)  # the client waits for the name: it is listening by then
    while True:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            if os.getppid() != parent:  # the test run is gone (killed): so is the zygote
                return None
            continue
        with conn:
            conn.settimeout(None)
            message, fds, _flags, _addr = socket.recv_fds(conn, 1 << 22, 3)
            request = json.loads(message)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                listener.close()
                for target, fd in enumerate(fds):
                    os.dup2(fd, target)
                    os.close(fd)
                os.environ.clear()
                os.environ.update(request["env"])
                return request["argv"]
            for fd in fds:
                os.close(fd)
            # a caller that gave up (its timeout, pytest's) is not waited for: its child is
            _reply(conn, {"pid": pid})
            _reply(conn, {"status": os.waitpid(pid, 0)[1]})


def _reply(conn: socket.socket, message: dict) -> None:
    try:
        conn.sendall(json.dumps(message).encode() + b"\n")
    except OSError:
        pass


if __name__ == "__main__":
    # sys.path as `python -m appliance.cli` run in the repository has it: the repository first
    sys.path[0] = str(REPO)
    import runpy

    import appliance.cli  # noqa: F401  (what the children share: the point of the zygote)

    argv = _serve(sys.argv[1])
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
        runpy.run_module("appliance.cli", run_name="__main__", alter_sys=True)
