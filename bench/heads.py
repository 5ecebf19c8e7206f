"""`shingle serve --heads 2` against `--heads 1` in the same run (docs/heads.md): 8 checkpoint
writers and a small-file workload, rounds alternated, with the server's CPU (the listener and
every head: the whole process tree) per MiB and per file beside the rates.

The heads are picked by the client's address, so each client here is a process of the
project's raw NFSv4.1 client (tests/nfs/nfs4_rawclient.py) bound to a source address of its
own, 127.0.0.1 + i: with 2 heads, clients alternate between them, as client hosts would.
One request in flight per client. The clients' CPU per wall second is printed too: on a
machine of few cores they compete with the server.
- checkpoint: 8 writers, each OPENs its own file, writes ``--mib`` MiB in 1 MiB UNSTABLE
  WRITEs and COMMITs; MB/s of all together (the last writer's end), CPU ms per MiB.
- small files: 4 clients, each in a directory of its own: OPEN (create), one 4 KiB WRITE
  (FILE_SYNC), CLOSE, ``--files`` times; files/s, CPU ms per file.
Each server is its own `shingle init` folder (10 emulated drives, zone files not
preallocated); both run through the whole run, each measured only while it is driven.

    .venv/bin/python bench/heads.py [--rounds 3] [--mib 32] [--files 200] [--heads 2]
        [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "nfs"))

from nfs4_rawclient import RawClient, open_args  # noqa: E402

from appliance.nfs.v4 import const as c  # noqa: E402
from appliance.nfs.v4 import types as t  # noqa: E402

MiB = 1 << 20
WRITERS = 8
SMALL_CLIENTS = 4
SMALL_SIZE = 4096


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """A `shingle serve --heads N` of its own folder on 127.0.0.1."""

    def __init__(self, folder: Path, heads: int):
        self.home, self.heads, self.port = folder, heads, free_port()
        self.proc: subprocess.Popen | None = None
        subprocess.run(
            [sys.executable, "-m", "appliance.cli", "init", str(folder), "--drive-size", "1GiB"]
            + ["--zone-size", "16MiB", "--no-preallocate"],
            check=True,
            capture_output=True,
            cwd=REPO,
        )
        config = folder / "shingle.toml"
        text = config.read_text()
        config.write_text(text.replace("[nfs]\n", '[nfs]\ngrace_seconds = 0\nportmap = "off"\n', 1))

    def start(self) -> None:
        log = self.home / "serve.log"
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "appliance.cli", "-c", str(self.home / "shingle.toml")]
                + ["serve", "--no-web", "--nfs-port", str(self.port), "--heads", str(self.heads)],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=REPO,
            )
        deadline = time.monotonic() + 180
        while "nfs://" not in log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"serve --heads {self.heads} did not start: {log}")
            time.sleep(0.2)

    def cpu(self) -> float:
        """CPU seconds of the listener and every head (and anything they started)."""
        assert self.proc is not None
        root = psutil.Process(self.proc.pid)
        total = 0.0
        for proc in [root, *root.children(recursive=True)]:
            try:
                times = proc.cpu_times()
            except psutil.Error:
                continue
            total += times.user + times.system
        return total

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(180)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _call(client: RawClient, ops: list):
    return client.compound([client.sequence_op(cachethis=False), *ops])


def checkpoint_writer(port: int, source: str, name: str, mib: int, go, out) -> None:
    data = os.urandom(MiB)
    client = RawClient(port, source=source).setup()
    fh, sid = client.open_new(name)
    go.wait()
    started, cpu0 = time.perf_counter(), time.process_time()
    for i in range(mib):
        args = t.ARGS[c.OP_WRITE](sid, i * MiB, c.UNSTABLE4, data)
        st, _ = _call(client, [(c.OP_PUTFH, fh), (c.OP_WRITE, args)])
        assert st == 0, st
    st, _ = _call(client, [(c.OP_PUTFH, fh), (c.OP_COMMIT, t.ARGS[c.OP_COMMIT](0, 0))])
    assert st == 0, st
    out.put((time.perf_counter() - started, time.process_time() - cpu0))
    client.close()


def small_files_client(port: int, source: str, name: str, files: int, go, out) -> None:
    data = os.urandom(SMALL_SIZE)
    client = RawClient(port, source=source).setup()
    st, res = client.session(
        [
            (c.OP_PUTFH, client.root_fh()),
            (c.OP_CREATE, t.ARGS[c.OP_CREATE]((c.NF4DIR, None), name, t.fattr4.cls([], b""))),
            (c.OP_GETFH, None),
        ]
    )
    assert st == 0, st
    folder = res[-1][2]
    go.wait()
    started, cpu0 = time.perf_counter(), time.process_time()
    for i in range(files):
        st, res = client.session(
            [
                (c.OP_PUTFH, folder),
                (c.OP_OPEN, open_args(f"f{i}", b"o", client.clientid)),
                (c.OP_GETFH, None),
            ]
        )
        assert st == 0, st
        fh, sid = res[-1][2], res[2][2].stateid
        st, res = client.session(
            [
                (c.OP_PUTFH, fh),
                (c.OP_WRITE, t.ARGS[c.OP_WRITE](sid, 0, c.FILE_SYNC4, data)),
                (c.OP_CLOSE, t.ARGS[c.OP_CLOSE](0, sid)),
            ]
        )
        assert st == 0, st
    out.put((time.perf_counter() - started, time.process_time() - cpu0))
    client.close()


def drive(
    server: Server, target, clients: int, tag: str, amount: int
) -> tuple[float, float, float]:
    """(the slowest client's seconds, the server's CPU seconds, the clients' CPU seconds) of
    one workload."""
    go = multiprocessing.Event()
    out: multiprocessing.Queue = multiprocessing.Queue()
    procs = [
        multiprocessing.Process(
            target=target,
            args=(server.port, f"127.0.0.{i + 1}", f"{tag}-{i}", amount, go, out),
        )
        for i in range(clients)
    ]
    for proc in procs:
        proc.start()
    time.sleep(1.0)  # every client connected and set up (its OPEN or folder made)
    cpu0 = server.cpu()
    go.set()
    times = []
    while len(times) < clients:
        try:
            times.append(out.get(timeout=5))
        except Exception:  # noqa: BLE001 - queue.Empty: check the clients are alive
            if any(p.exitcode not in (None, 0) for p in procs):
                raise SystemExit(f"a client of {tag} failed") from None
    cpu = server.cpu() - cpu0
    for proc in procs:
        proc.join()
    return max(w for w, _ in times), cpu, sum(c for _, c in times)


def one_round(server: Server, tag: str, mib: int, files: int) -> dict:
    seconds, cpu, client_cpu = drive(server, checkpoint_writer, WRITERS, f"{tag}-ckpt", mib)
    total_mib = WRITERS * mib
    small_s, small_cpu, small_client_cpu = drive(
        server, small_files_client, SMALL_CLIENTS, f"{tag}-small", files
    )
    total_files = SMALL_CLIENTS * files
    return {
        "ckpt_mb_s": total_mib * MiB / seconds / 1e6,
        "ckpt_cpu_ms_per_mib": cpu * 1000 / total_mib,
        "ckpt_cpu_per_wall": cpu / seconds,
        "ckpt_client_cpu_per_wall": client_cpu / seconds,
        "small_files_s": total_files / small_s,
        "small_cpu_ms_per_file": small_cpu * 1000 / total_files,
        "small_cpu_per_wall": small_cpu / small_s,
        "small_client_cpu_per_wall": small_client_cpu / small_s,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, default=2, help="heads compared with one")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mib", type=int, default=32, help="MiB per checkpoint writer")
    parser.add_argument("--files", type=int, default=200, help="small files per client")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="shingle-bench-heads-"))
    layouts = {1: f"{1} head", args.heads: f"{args.heads} heads"}
    servers = {n: Server(folder / f"heads{n}", n) for n in layouts}
    results: dict[str, list] = {name: [] for name in layouts.values()}
    try:
        for server in servers.values():
            server.start()
        for round_ in range(args.rounds):
            order = list(layouts) if round_ % 2 == 0 else list(reversed(layouts))
            for n in order:
                got = one_round(servers[n], f"r{round_}", args.mib, args.files)
                results[layouts[n]].append(got)
                shown = json.dumps({k: round(v, 3) for k, v in got.items()})
                print(f"round {round_} {layouts[n]}: {shown}", flush=True)
    finally:
        for server in servers.values():
            server.stop()
        shutil.rmtree(folder, ignore_errors=True)
    print(
        f"# {WRITERS} checkpoint writers x {args.mib} MiB, {SMALL_CLIENTS} small-file clients "
        f"x {args.files} files of {SMALL_SIZE} B; median of {args.rounds} alternated rounds"
    )
    summary = {}
    for name, runs in results.items():
        summary[name] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"{name}: " + " ".join(f"{k}={v:.3f}" for k, v in summary[name].items()))
    one, many = summary[layouts[1]], summary[layouts[args.heads]]
    print(
        f"{args.heads} heads / 1 head: checkpoint {many['ckpt_mb_s'] / one['ckpt_mb_s']:.2f}x "
        f"at {many['ckpt_cpu_ms_per_mib'] / one['ckpt_cpu_ms_per_mib']:.2f}x CPU per MiB; "
        f"small files {many['small_files_s'] / one['small_files_s']:.2f}x at "
        f"{many['small_cpu_ms_per_file'] / one['small_cpu_ms_per_file']:.2f}x CPU per file"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": results, "median": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
