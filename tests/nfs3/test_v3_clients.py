"""Real NFSv3 clients (Debian's libnfs-utils: nfs-cp, nfs-ls, nfs-cat; nfs-rs
with version=3) against the server, with the bytes checked through NFSv4.1."""

from __future__ import annotations

import os

import nfs_rs
import pytest
from nfs3_helpers import MiB, add_export, libnfs, nfs_url, nfsrs3, nfsrs4, start_server


def test_libnfs_tools_and_nfsv41_share_files(server, tmp_path):
    port = server.port
    payload = os.urandom(2 * MiB + 13)  # more than one 1 MiB WRITE
    src = tmp_path / "in.bin"
    src.write_bytes(payload)
    libnfs("nfs-cp", str(src), nfs_url(port, "/export/in.bin"))
    back = os.urandom(MiB + 5)
    with nfsrs4(port) as cl:
        with cl.open("in.bin", "rb") as f:
            assert f.read() == payload
        cl.mkdir("from4")
        with cl.open("from4/out.bin", "wb") as f:
            f.write(back)
        with cl.open("from4/note.txt", "wb") as f:
            f.write(b"written over NFSv4.1\n")
        for i in range(150):  # enough names that a listing takes several READDIRPLUS replies
            with cl.open(f"from4/f{i:03d}", "wb") as f:
                f.write(b"x" * i)
    out = tmp_path / "out.bin"
    libnfs("nfs-cp", nfs_url(port, "/export/from4/out.bin"), str(out))
    assert out.read_bytes() == back
    assert (
        libnfs("nfs-cat", nfs_url(port, "/export/from4/note.txt")).stdout
        == b"written over NFSv4.1\n"
    )
    top = libnfs("nfs-ls", nfs_url(port, "/export")).stdout.decode().splitlines()
    by_name = {line.split()[-1]: line for line in top}
    assert sorted(by_name) == ["from4", "in.bin"]
    assert by_name["from4"].startswith("d") and str(len(payload)) in by_name["in.bin"].split()
    names = [
        line.split()[-1]
        for line in libnfs("nfs-ls", nfs_url(port, "/export/from4")).stdout.decode().splitlines()
    ]
    assert sorted(names) == sorted(["out.bin", "note.txt"] + [f"f{i:03d}" for i in range(150)])


def test_libnfs_errors(server, stack, tmp_path):
    port = server.port
    missing = libnfs("nfs-cat", nfs_url(port, "/export/no-such-file"), check=False)
    assert missing.returncode != 0
    assert b"NFS3ERR_NOENT" in missing.stderr or b"No such file" in missing.stderr, missing.stderr
    # nfs-cp creates GUARDED: an existing name is refused, the file left as it was
    first, second = tmp_path / "first", tmp_path / "second"
    first.write_bytes(b"first version\n")
    second.write_bytes(b"second\n")
    libnfs("nfs-cp", str(first), nfs_url(port, "/export/kept.txt"))
    again = libnfs("nfs-cp", str(second), nfs_url(port, "/export/kept.txt"), check=False)
    assert again.returncode != 0 and b"NFS3ERR_EXIST" in again.stderr, again.stderr
    assert libnfs("nfs-cat", nfs_url(port, "/export/kept.txt")).stdout == b"first version\n"
    unexported = libnfs("nfs-ls", nfs_url(port, "/not-exported"), check=False)
    assert unexported.returncode != 0 and b"MNT3ERR_NOENT" in unexported.stderr, unexported.stderr
    # an export for another address: MOUNT refuses this client (from 127.0.0.1) with MNT3ERR_ACCES
    add_export(stack.catalog, name="/elsewhere", clients="127.0.0.2/32")
    server.server.exports.refresh()
    refused = libnfs("nfs-ls", nfs_url(port, "/elsewhere"), check=False)
    assert refused.returncode != 0 and b"MNT3ERR_ACCES" in refused.stderr, refused.stderr


def test_nfsrs_v3_round_trip_and_nfsv41_reads_it(server):
    port = server.port
    payload = os.urandom(3 * MiB + 7)
    with nfsrs3(port) as cl:
        assert str(cl.version.value) == "3"
        cl.mkdir("jobs/in", parents=True, exist_ok=True)
        with cl.open("jobs/in/data.bin", "wb") as f:
            f.write(payload)
        with cl.open("jobs/in/data.bin", "rb") as f:
            assert f.read() == payload
        assert cl.stat("jobs/in/data.bin").size == len(payload)
        cl.rename("jobs/in/data.bin", "jobs/in/moved.bin")
        assert cl.listdir("jobs/in") == ["moved.bin"]
        with cl.open("jobs/small", "wb") as f:
            f.write(b"0123456789")
        cl.link("jobs/small", "jobs/hard")
        assert cl.stat("jobs/small").nlink == 2
        cl.symlink("small", "jobs/sym")
        assert cl.readlink("jobs/sym") == "small"
        cl.chmod("jobs/small", 0o640)
        cl.chown("jobs/small", 1234, 5678)
        cl.utime("jobs/small", ns=(1_000_000_000_123, 2_000_000_000_456))
        st = cl.stat("jobs/hard")
        assert (st.mode & 0o7777, st.uid, st.gid) == (0o640, 1234, 5678)
        assert (st.atime, st.mtime) == (1_000_000_000_123, 2_000_000_000_456)
        cl.truncate("jobs/small", 4)
        with pytest.raises(nfs_rs.NfsNotFoundError):
            cl.stat("jobs/none")
        with pytest.raises(nfs_rs.NfsAlreadyExistsError):
            cl.mkdir("jobs/in")
        with pytest.raises(OSError):  # NFS3ERR_NOTEMPTY
            cl.rmdir("jobs/in")
    with nfsrs4(port) as cl:
        with cl.open("jobs/in/moved.bin", "rb") as f:
            assert f.read() == payload
        with cl.open("jobs/hard", "rb") as f:
            assert f.read() == b"0123"
        assert cl.readlink("jobs/sym") == "small"
        with cl.open("jobs/from4.bin", "wb") as f:
            f.write(payload[:MiB])
    with nfsrs3(port) as cl:
        with cl.open("jobs/from4.bin", "rb") as f:
            assert f.read() == payload[:MiB]
        cl.unlink("jobs/in/moved.bin")
        cl.rmdir("jobs/in")
        assert sorted(cl.listdir("jobs")) == ["from4.bin", "hard", "small", "sym"]


def test_nfsrs_v3_paged_listing_and_exports(server):
    port = server.port
    with nfsrs3(port) as cl:
        cl.mkdir("many")
        for i in range(120):
            with cl.open(f"many/entry-with-a-longish-name-{i:04d}", "wb") as f:
                f.write(b"")
    # a 2 KiB reply limit forces many READDIRPLUS pages that continue from cookies
    with nfsrs3(port, readdir_buffer=2048) as cl:
        names = cl.listdir("many")
        assert sorted(names) == [f"entry-with-a-longish-name-{i:04d}" for i in range(120)]
    exports = nfs_rs.list_exports("127.0.0.1", mount_port=port)
    assert [(e.path, e.groups) for e in exports] == [("/export", ("127.0.0.1/32",))]


def test_read_only_export_refuses_changes(stack):
    add_export(stack.catalog, name="/ro", access="ro")
    srv = start_server(stack)
    try:
        with nfsrs3(srv.port, export="ro") as cl:
            with pytest.raises(OSError) as info:
                cl.mkdir("x")
            assert "read-only" in str(info.value).lower() or "ROFS" in str(info.value), info.value
            assert cl.listdir(".") == []
    finally:
        srv.stop()
