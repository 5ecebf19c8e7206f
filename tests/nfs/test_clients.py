"""Real third-party NFSv4.1 clients (nfs-rs, nfs4fs) against the server."""

from __future__ import annotations

import hashlib
import os
import threading
import time

import pytest
from nfs4_support import MiB, add_export, nfs4fs, nfsrs, start_server


def test_nfsrs_round_trip(server):
    with nfsrs(server.port) as cl:
        assert str(cl.version.value) == "4.1"
        cl.mkdir("jobs/2026/input", parents=True, exist_ok=True)
        payload = os.urandom(3 * MiB + 123)
        with cl.open("jobs/2026/input/data.bin", "wb") as f:
            f.write(payload)
        with cl.open("jobs/2026/input/data.bin", "rb") as f:
            assert hashlib.sha256(f.read()).digest() == hashlib.sha256(payload).digest()
        assert cl.stat("jobs/2026/input/data.bin").size == len(payload)
        assert cl.listdir("jobs/2026/input") == ["data.bin"]
        cl.rename("jobs/2026/input/data.bin", "jobs/2026/input/moved.bin")
        assert cl.listdir("jobs/2026/input") == ["moved.bin"]
        cl.unlink("jobs/2026/input/moved.bin")
        cl.rmdir("jobs/2026/input")
        assert cl.listdir("jobs/2026") == []
        # the root is listed through LOOKUP "." by nfs-rs
        assert "jobs" in cl.listdir(".")


def test_nfs4fs_round_trip(server):
    fs = nfs4fs(server.port)
    fs.mkdir("/ds")
    with fs.open("/ds/small.txt", "wb") as f:  # OPEN+WRITE in one COMPOUND, FILE_SYNC
        f.write(b"hello shingle")
    big = os.urandom(2 * MiB + 5)
    with fs.open("/ds/big.bin", "wb") as f:
        f.write(big)
    assert fs.cat("/ds/small.txt") == b"hello shingle"
    assert fs.cat("/ds/big.bin") == big
    names = sorted(e.rsplit("/", 1)[-1] for e in fs.ls("/ds", detail=False))
    assert names == ["big.bin", "small.txt"]
    fs.mv("/ds/small.txt", "/ds/renamed.txt")
    assert fs.cat("/ds/renamed.txt") == b"hello shingle"
    fs.rm("/ds/renamed.txt")
    assert not fs.exists("/ds/renamed.txt")
    # the other client sees the same bytes
    with nfsrs(server.port) as cl:
        with cl.open("ds/big.bin", "rb") as f:
            assert f.read() == big


def test_links_modes_times_truncate_append(server):
    with nfsrs(server.port) as cl:
        with cl.open("f", "wb") as f:
            f.write(b"0123456789")
        cl.link("f", "hard")
        assert cl.stat("f").nlink == 2
        assert cl.stat("hard").fileid == cl.stat("f").fileid
        cl.symlink("f", "sym")
        assert cl.readlink("sym") == "f"
        cl.chmod("f", 0o640)
        assert cl.stat("hard").mode & 0o7777 == 0o640
        cl.chown("f", 1234, 5678)
        st = cl.stat("f")
        assert (st.uid, st.gid) == (1234, 5678)
        cl.utime("f", ns=(1_000_000_000_123, 2_000_000_000_456))
        st = cl.stat("f")
        assert (st.atime, st.mtime) == (1_000_000_000_123, 2_000_000_000_456)
        with cl.open("f", "ab") as f:
            f.write(b"abc")
        with cl.open("f", "rb") as f:
            assert f.read() == b"0123456789abc"
        cl.truncate("f", 4)
        with cl.open("hard", "rb") as f:
            assert f.read() == b"0123"
        cl.unlink("f")
        assert cl.stat("hard").nlink == 1
        with pytest.raises(FileNotFoundError):
            cl.stat("f")


def test_many_small_files_and_big_directory(server):
    fs = nfs4fs(server.port)
    with nfsrs(server.port) as cl:
        cl.mkdir("small")
        for i in range(200):
            with cl.open(f"small/{i:04d}", "wb") as f:
                f.write(f"file {i}".encode())
        for i in range(0, 200, 37):
            with cl.open(f"small/{i:04d}", "rb") as f:
                assert f.read() == f"file {i}".encode()
    # 10,000 entries, created through the namespace (fast) and listed over NFS by both clients
    ns = server.server.namespace
    from engine.namespace import ROOT

    d = ns.mkdir(ROOT, ns.root_ino, "big")
    for i in range(10_000):
        ns.create(ROOT, d.ino, f"entry-{i:05d}")
    with nfsrs(server.port) as cl:
        names = cl.listdir("big")
    assert len(names) == 10_000 and len(set(names)) == 10_000
    listed = fs.ls("/big", detail=False)
    assert len(listed) == 10_000


def test_rename_over_existing_while_reader_polls(server):
    old, new = b"O" * 100_000, b"N" * 100_000
    with nfsrs(server.port) as cl:
        with cl.open("target", "wb") as f:
            f.write(old)
    seen, bad, reads = set(), [], [0]
    stop = threading.Event()

    fs = nfs4fs(server.port)

    def reader():
        # nfs4fs resolves the path on every open (nfs-rs caches the old handle,
        # which is rightly STALE once the replaced file is freed)
        while not stop.is_set():
            try:
                body = fs.cat("/target")
            except Exception as exc:  # noqa: BLE001 - a vanished name is a failure we record
                bad.append(repr(exc))
                continue
            if body not in (old, new):
                bad.append(body[:20])
            seen.add(body[:1])
            reads[0] += 1

    th = threading.Thread(target=reader)
    th.start()
    try:
        with nfsrs(server.port) as cl:
            for i in range(5):
                with cl.open(f"tmp{i}", "wb") as f:
                    f.write(new if i % 2 == 0 else old)
                cl.rename(f"tmp{i}", "target")
                time.sleep(0.05)
        deadline = time.monotonic() + 20
        while reads[0] < 5 and time.monotonic() < deadline:  # a loaded machine: let the reader poll
            time.sleep(0.05)
    finally:
        stop.set()
        th.join(60)
    assert not bad, bad[:3]
    assert seen <= {b"O", b"N"} and reads[0] >= 5


def test_parallel_writers_and_readers(server):
    blobs = {i: os.urandom(MiB + i * 4097) for i in range(8)}
    failures = []

    def write(i):
        try:
            with nfsrs(server.port) as cl:
                with cl.open(f"w{i}", "wb") as f:
                    f.write(blobs[i])
        except Exception as exc:  # noqa: BLE001
            failures.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    [th.start() for th in threads]
    [th.join(120) for th in threads]
    assert not failures, failures
    shared = blobs[3]
    digests = []

    def read():
        try:
            with nfsrs(server.port) as cl:
                with cl.open("w3", "rb") as f:
                    digests.append(hashlib.sha256(f.read()).hexdigest())
        except Exception as exc:  # noqa: BLE001
            failures.append(exc)

    threads = [threading.Thread(target=read) for _ in range(16)]
    [th.start() for th in threads]
    [th.join(120) for th in threads]
    assert not failures, failures
    assert digests == [hashlib.sha256(shared).hexdigest()] * 16
    with nfsrs(server.port) as cl:
        for i, blob in blobs.items():
            with cl.open(f"w{i}", "rb") as f:
                assert f.read() == blob


def test_default_export_squashes_root(stack):
    # no exports row: the namespace root is exported as /export with root_squash
    srv = start_server(stack)
    try:
        import nfs_rs

        with nfsrs(srv.port, uid=0, gid=0) as cl:
            assert cl.listdir(".") == []
            with pytest.raises(nfs_rs.NfsPermissionError):
                cl.mkdir("denied")
    finally:
        srv.stop()


def test_read_only_export(stack):
    add_export(stack.catalog, access="ro")
    srv = start_server(stack)
    try:
        import nfs_rs

        with nfsrs(srv.port) as cl:
            with pytest.raises(nfs_rs.NfsError):
                cl.mkdir("nope")
    finally:
        srv.stop()
