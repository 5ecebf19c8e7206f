"""The NFS workloads of the A/B benchmark, parametrized by client.

Each workload runs in a child process of the harness (so a hung or crashed
client or server costs one workload, not the run):

    .venv/bin/python bench/workloads.py --client nfsrs|nfs4fs --port P --workload NAME --params JSON

prints one JSON object on its last stdout line: ``{"ok": true, "metrics": {...}}``
or ``{"ok": false, "error": "..."}``. In-process callers use ``run(client,
port, workload, params)``.

Clients: ``nfsrs`` (nfs-rs, NFSv4.1: UNSTABLE WRITE + COMMIT per write call)
and ``nfs4fs`` (fsspec over ntirpc: FILE_SYNC writes, OPEN+WRITE compounds).
Every path is below ``/bench`` of the export: nfs-rs lists an export's root
with LOOKUP ".", which NFS-Ganesha refuses.

Written data carries the block index in its first 8 bytes, so reads are
checked block by block and no server can dedupe or compress the stream.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import struct
import sys
import threading
import time
import traceback

MiB = 1 << 20
CLIENTS = ("nfsrs", "nfs4fs")
BASE = "bench"
# a workload's result may carry (amount, unit) of the work it did under this key: the harness
# divides the server's CPU seconds by it ("MiB" moved, or "kop": thousands of operations)
WORK = "_work"

# Sizes per mode: "full" is the spec, "quick" runs every workload once in
# a few minutes, "smoke" only proves the harness works (tests).
SIZES = {
    "full": dict(
        seq_bytes=2048 * MiB,
        io=MiB,
        linux_io=32 * MiB,
        small_files=2000,
        small_size=4096,
        rand_seconds=10.0,
        rand_file=256 * MiB,
        ckpt_writers=8,
        ckpt_bytes=256 * MiB,
        shard_readers=16,
        shard_bytes=256 * MiB,
    ),
    "quick": dict(
        seq_bytes=512 * MiB,
        io=MiB,
        linux_io=32 * MiB,
        small_files=500,
        small_size=4096,
        rand_seconds=3.0,
        rand_file=32 * MiB,
        ckpt_writers=8,
        ckpt_bytes=32 * MiB,
        shard_readers=16,
        shard_bytes=64 * MiB,
    ),
    "smoke": dict(
        seq_bytes=8 * MiB,
        io=MiB,
        linux_io=4 * MiB,
        small_files=30,
        small_size=4096,
        rand_seconds=0.5,
        rand_file=2 * MiB,
        ckpt_writers=8,
        ckpt_bytes=2 * MiB,
        shard_readers=16,
        shard_bytes=4 * MiB,
    ),
}


class WorkloadError(RuntimeError):
    """The server answered wrongly (short read, bad data, missing file)."""


def pattern_block(size: int, seed: int = 0x5EED) -> bytearray:
    return bytearray(random.Random(seed).randbytes(size))


def stamp(block: bytearray, index: int) -> bytearray:
    struct.pack_into("<Q", block, 0, index)
    return block


# -- client adapters: the same few calls on both clients -----------------------------
class NfsRs:
    kind = "nfsrs"

    def __init__(self, port: int):
        import nfs_rs

        self.client = nfs_rs.Client.connect(
            f"nfs://127.0.0.1:{port}/export?version=4.1",
            nfs_port=port,
            noresvport=True,
            uid=0,
            gid=0,
            connect_timeout=20,
            operation_timeout=120,
        )

    def makedirs(self, path: str) -> None:
        self.client.mkdir(path, parents=True, exist_ok=True)

    def write_file(self, path: str, total: int, io_size: int) -> int:
        block = pattern_block(io_size)
        with self.client.open(path, "wb") as f:
            for i in range(total // io_size):
                f.write(stamp(block, i))
        return total

    def read_file(self, path: str, io_size: int, expect: int) -> int:
        buf = bytearray(io_size)
        done = 0
        with self.client.open(path, "rb") as f:
            while True:
                n = f.readinto(buf)
                if not n:
                    break
                check_block(path, buf, done, io_size)
                done += n
        return check_size(path, done, expect)

    def write_small(self, path: str, data: bytes) -> None:
        with self.client.open(path, "wb") as f:
            f.write(data)

    def stat_size(self, path: str) -> int:
        return self.client.stat(path).size

    def remove(self, path: str) -> None:
        self.client.unlink(path)

    def rename(self, src: str, dst: str) -> None:
        self.client.rename(src, dst)

    def open_rw(self, path: str):
        f = self.client.open(path, "r+b")
        return f, lambda data, off: f.write_at(data, off)

    def listdir(self, path: str) -> list[str]:
        return self.client.listdir(path)

    def close(self) -> None:
        self.client.close()


class Nfs4fs:
    kind = "nfs4fs"

    def __init__(self, port: int):
        import fsspec
        import nfs4fs  # noqa: F401  (registers the nfs4 protocol)

        self.fs = fsspec.filesystem(
            "nfs4",
            host=f"127.0.0.1:{port}",
            root="export",
            auth="auth_sys",
            minor_version=1,
            skip_instance_cache=True,
            request_timeout=120.0,
        )

    @staticmethod
    def p(path: str) -> str:
        return "/" + path

    def makedirs(self, path: str) -> None:
        self.fs.makedirs(self.p(path), exist_ok=True)

    def write_file(self, path: str, total: int, io_size: int) -> int:
        block = pattern_block(io_size)
        with self.fs.open(self.p(path), "wb") as f:
            for i in range(total // io_size):
                f.write(stamp(block, i))
        return total

    def read_file(self, path: str, io_size: int, expect: int) -> int:
        buf = bytearray(io_size)
        done = 0
        # no read-ahead cache of the client: both servers see the same 1 MiB READs
        with self.fs.open(self.p(path), "rb", cache_type="none") as f:
            while True:
                n = f.readinto(buf)
                if not n:
                    break
                check_block(path, buf, done, io_size)
                done += n
        return check_size(path, done, expect)

    def write_small(self, path: str, data: bytes) -> None:
        self.fs.pipe_file(self.p(path), data)

    def stat_size(self, path: str) -> int:
        return self.fs.info(self.p(path))["size"]

    def remove(self, path: str) -> None:
        self.fs.rm_file(self.p(path))

    def rename(self, src: str, dst: str) -> None:
        self.fs.mv(self.p(src), self.p(dst))

    def open_rw(self, path: str):
        f = self.fs.open(self.p(path), "r+b")

        def write_at(data, off):
            f.seek(off)
            f.write(data)

        return f, write_at

    def listdir(self, path: str) -> list[str]:
        return [
            name.rstrip("/").rsplit("/", 1)[-1] for name in self.fs.ls(self.p(path), detail=False)
        ]

    def close(self) -> None:
        self.fs.close()


ADAPTERS = {"nfsrs": NfsRs, "nfs4fs": Nfs4fs}


def connect(client: str, port: int):
    if client not in ADAPTERS:
        raise ValueError(f"client {client!r}: expected one of {', '.join(CLIENTS)}")
    return ADAPTERS[client](port)


def check_block(path: str, buf, offset: int, io_size: int) -> None:
    if offset % io_size == 0:
        index = struct.unpack_from("<Q", buf, 0)[0]
        if index != offset // io_size:
            raise WorkloadError(
                f"{path}: block at offset {offset} holds index {index}, "
                f"expected {offset // io_size} (wrong data returned)"
            )


def check_size(path: str, done: int, expect: int) -> int:
    if done != expect:
        raise WorkloadError(f"{path}: read {done} bytes, expected {expect}")
    return done


def mbps(nbytes: int, seconds: float) -> float:
    return round(nbytes / seconds / 1e6, 1)


# -- workloads -----------------------------------------------------------------------
def seq_write(a, p: dict) -> dict:
    a.makedirs(BASE)
    path = f"{BASE}/seq-{a.kind}.bin"
    t = time.perf_counter()
    a.write_file(path, p["seq_bytes"], p["io"])
    return {
        "seq_write_MBps": mbps(p["seq_bytes"], time.perf_counter() - t),
        WORK: (p["seq_bytes"] / MiB, "MiB"),
    }


def linux_write(a, p: dict) -> dict:
    """The Linux client's pattern: write() calls of ``linux_io`` (8-64 MiB), which the client
    sends as 1 MiB UNSTABLE WRITEs and one COMMIT per call, instead of a COMMIT per MiB."""
    a.makedirs(BASE)
    path = f"{BASE}/linux-{a.kind}.bin"
    t = time.perf_counter()
    a.write_file(path, p["seq_bytes"], p["linux_io"])
    elapsed = time.perf_counter() - t
    a.remove(path)
    return {
        "seq_write_linux_MBps": mbps(p["seq_bytes"], elapsed),
        WORK: (p["seq_bytes"] / MiB, "MiB"),
    }


def seq_read(a, p: dict) -> dict:
    """Reads the file seq_write left; the harness decides whether it is cold or warm."""
    path = f"{BASE}/seq-{a.kind}.bin"
    t = time.perf_counter()
    n = a.read_file(path, p["io"], p["seq_bytes"])
    return {"seq_read_MBps": mbps(n, time.perf_counter() - t), WORK: (n / MiB, "MiB")}


def seq_cleanup(a, p: dict) -> dict:
    a.remove(f"{BASE}/seq-{a.kind}.bin")
    return {}


def small_files(a, p: dict) -> dict:
    d = f"{BASE}/small-{a.kind}"
    a.makedirs(d)
    names = [f"{d}/f{i:05d}" for i in range(p["small_files"])]
    data = bytes(pattern_block(p["small_size"]))
    t = time.perf_counter()
    for name in names:
        a.write_small(name, data)
    t_create = time.perf_counter() - t
    t = time.perf_counter()
    for name in names:
        if a.stat_size(name) != len(data):
            raise WorkloadError(f"{name}: size {a.stat_size(name)} after writing {len(data)} bytes")
    t_stat = time.perf_counter() - t
    t = time.perf_counter()
    for name in names:
        a.remove(name)
    t_remove = time.perf_counter() - t
    left = a.listdir(d)
    if left:
        raise WorkloadError(f"{d}: {len(left)} entries left after removing all (e.g. {left[:3]})")
    n = len(names)
    return {
        "create_per_s": round(n / t_create, 1),
        "stat_per_s": round(n / t_stat, 1),
        "remove_per_s": round(n / t_remove, 1),
        WORK: (3 * n / 1000, "kop"),  # a create, a stat and a remove per file
    }


def random_write(a, p: dict) -> dict:
    """4 KiB writes at random 4 KiB-aligned offsets of a written file, for rand_seconds."""
    a.makedirs(BASE)
    path = f"{BASE}/rand-{a.kind}.bin"
    a.write_file(path, p["rand_file"], MiB)
    blocks = p["rand_file"] // 4096
    rng = random.Random(7)
    data = bytes(pattern_block(4096, seed=9))
    f, write_at = a.open_rw(path)
    count = 0
    try:
        t0 = time.perf_counter()
        deadline = t0 + p["rand_seconds"]
        while True:
            write_at(data, rng.randrange(blocks) * 4096)
            count += 1
            if count % 16 == 0 and time.perf_counter() >= deadline:
                break
        elapsed = time.perf_counter() - t0
    finally:
        f.close()
    if a.stat_size(path) != p["rand_file"]:
        raise WorkloadError(f"{path}: size changed to {a.stat_size(path)} by in-place writes")
    a.remove(path)
    # the CPU also covers writing the file first: counted as its 4 KiB writes' worth is not
    # possible, so the unit is the random writes alone (the setup is the same for both servers)
    return {"randwrite_iops": round(count / elapsed, 1), WORK: (count / 1000, "kop")}


def run_threads(fn, count: int) -> float:
    """Run fn(i) in count threads started together; wall seconds; re-raise the first error."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(count + 1)

    def body(i):
        try:
            barrier.wait()
            fn(i)
        except BaseException as exc:  # noqa: BLE001 (reported to the caller below)
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for th in threads:
        th.start()
    barrier.wait()
    t = time.perf_counter()
    for th in threads:
        th.join()
    elapsed = time.perf_counter() - t
    if errors:
        raise errors[0]
    return elapsed


def checkpoint_writers(a, p: dict) -> dict:
    """8 ranks, each on its own connection, write their shard under a temporary
    name and rename it into place (the crash-safe checkpoint pattern)."""
    d = f"{BASE}/ckpt-{a.kind}"
    a.makedirs(d)
    n, size = p["ckpt_writers"], p["ckpt_bytes"]
    conns = [connect(a.kind, a.port) for _ in range(n)]
    try:

        def write(i):
            conns[i].write_file(f"{d}/.rank{i}.tmp", size, p["io"])
            conns[i].rename(f"{d}/.rank{i}.tmp", f"{d}/rank{i}.pt")

        elapsed = run_threads(write, n)
    finally:
        for c in conns:
            c.close()
    names = sorted(a.listdir(d))
    want = sorted(f"rank{i}.pt" for i in range(n))
    if names != want:
        raise WorkloadError(f"{d}: holds {names}, expected {want}")
    for name in names:
        a.remove(f"{d}/{name}")
    return {"ckpt8_write_MBps": mbps(n * size, elapsed), WORK: (n * size / MiB, "MiB")}


def shard_readers(a, p: dict) -> dict:
    """16 readers, each on its own connection, read the whole of one dataset shard."""
    a.makedirs(BASE)
    path = f"{BASE}/shard-{a.kind}.bin"
    size, n = p["shard_bytes"], p["shard_readers"]
    a.write_file(path, size, MiB)
    conns = [connect(a.kind, a.port) for _ in range(n)]
    try:
        elapsed = run_threads(lambda i: conns[i].read_file(path, p["io"], size), n)
    finally:
        for c in conns:
            c.close()
    a.remove(path)
    # the shard is written once and read n times: both count as MiB moved
    return {"shard16_read_MBps": mbps(n * size, elapsed), WORK: ((n + 1) * size / MiB, "MiB")}


WORKLOADS = {
    "seq_write": seq_write,
    "linux_write": linux_write,
    "seq_read": seq_read,
    "seq_cleanup": seq_cleanup,
    "small_files": small_files,
    "random_write": random_write,
    "checkpoint_writers": checkpoint_writers,
    "shard_readers": shard_readers,
}


def run(client: str, port: int, workload: str, params: dict) -> dict:
    if workload not in WORKLOADS:
        raise ValueError(f"workload {workload!r}: expected one of {', '.join(WORKLOADS)}")
    a = connect(client, port)
    a.port = port
    try:
        return WORKLOADS[workload](a, params)
    finally:
        a.close()


# -- page cache ----------------------------------------------------------------------
def evict_page_cache(dirs) -> str:
    """Make the next read cold. drop_caches when the kernel lets us; else
    posix_fadvise(DONTNEED) on every file of the servers' backing stores
    (clean pages of those files leave the cache). Returns the method used."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches"
    except OSError:
        pass
    for d in dirs:
        for root, _dirs, files in os.walk(d):
            for name in files:
                path = os.path.join(root, name)
                try:
                    fd = os.open(path, os.O_RDONLY)
                except OSError:
                    continue
                try:
                    os.fdatasync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                except OSError:
                    pass
                finally:
                    os.close(fd)
    return "fadvise"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--client", required=True, choices=CLIENTS)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    ap.add_argument("--params", required=True, help="JSON object of sizes (see SIZES)")
    args = ap.parse_args(argv)
    try:
        metrics = run(args.client, args.port, args.workload, json.loads(args.params))
        work = metrics.pop(WORK, None)
        out = {"ok": True, "metrics": metrics, "work": work}
    except Exception as exc:  # noqa: BLE001 (reported as data: the harness records it)
        traceback.print_exc(file=sys.stderr)
        out = {"ok": False, "error": f"{type(exc).__name__}: {exc}".strip()[:500]}
    print(json.dumps(out), flush=True)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
