"""SMB through Samba over the FUSE mount, with real clients: smbclient (Samba's) and smbprotocol."""

from __future__ import annotations

import datetime
import functools
import hashlib
import os
import signal
import socket
import time
import uuid

import pytest
from smbclient._io import SMBFileTransaction, set_info
from smbprotocol.connection import Connection
from smbprotocol.create_contexts import (
    CreateContextName,
    SMB2CreateContextRequest,
    SMB2CreateTimewarpToken,
)
from smbprotocol.exceptions import NtStatus, SMBResponseException
from smbprotocol.file_info import FileBasicInformation
from smbprotocol.open import (
    CreateDisposition,
    CreateOptions,
    FileAttributes,
    FilePipePrinterAccessMask,
    ImpersonationLevel,
    Open,
    ShareAccess,
)
from smbprotocol.session import Session
from smbprotocol.structure import DateTimeField
from smbprotocol.tree import TreeConnect

from appliance.smb.mount import CACHE_TIMEOUT_S
from tests.smb.conftest import PASSWORDS, shingle, unc

LARGE_MIB = 256  # the issue says 1 GiB: 54 s for the test here, so a quarter of it
# the issue says 10,000: measured here 35 s to create them over the mount, 36 s to list them with
# smbprotocol, 32 s with smbclient (3.5 ms an entry; 1,000 list in 1.7 s), so a fifth of it
MANY_ENTRIES = 2_000


def _nfs(served, uid: int = 0, gid: int = 0):
    import nfs_rs

    return nfs_rs.Client.connect(
        f"nfs://127.0.0.1:{served.nfs_port}/export?version=4.1",
        nfs_port=served.nfs_port,
        noresvport=True,
        uid=uid,
        gid=gid,
        connect_timeout=20,
        operation_timeout=60,
    )


def _sha256_file(path, chunk: int = 8 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def test_put_and_get_of_a_large_file_keep_its_sha256(served, tmp_path):
    source = tmp_path / "big.bin"
    block = os.urandom(1 << 20)
    with open(source, "wb") as f:
        for i in range(LARGE_MIB):
            f.write(i.to_bytes(8, "little") + block[8:])  # every MiB differs
    want = _sha256_file(source)
    served.smbclient("export", "alice", f"put {source} big.bin")
    # the mount's kernel may hold a size it read mid-transfer for its attribute timeout (1 s):
    # seen once under a loaded full run; the bytes below are what the test is about
    deadline = time.monotonic() + 3.0
    while (served.mount / "big.bin").stat().st_size != LARGE_MIB << 20:
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert (served.mount / "big.bin").stat().st_size == LARGE_MIB << 20
    back = tmp_path / "back.bin"
    source.unlink()
    served.smbclient("export", "alice", f"get big.bin {back}")
    assert _sha256_file(back) == want
    assert _sha256_file(served.mount / "big.bin") == want  # the local mount reads the same bytes
    back.unlink()
    served.smbclient("export", "alice", "del big.bin")
    assert not (served.mount / "big.bin").exists()


def test_mkdir_rename_and_delete_with_smbprotocol(served, smb_session):
    smb = smb_session
    port = served.smb_port
    smb.mkdir(unc(served, "export", "work"), port=port)
    with smb.open_file(unc(served, "export", "work/a.txt"), mode="wb", port=port) as f:
        f.write(b"first")
    smb.rename(unc(served, "export", "work/a.txt"), unc(served, "export", "work/b.txt"), port=port)
    assert sorted(smb.listdir(unc(served, "export", "work"), port=port)) == ["b.txt"]
    assert (served.mount / "work" / "b.txt").read_bytes() == b"first"
    assert (served.mount / "work" / "b.txt").stat().st_uid == 20000  # alice's uid
    # rename over an existing file replaces it
    with smb.open_file(unc(served, "export", "work/c.txt"), mode="wb", port=port) as f:
        f.write(b"second")
    smb.replace(unc(served, "export", "work/c.txt"), unc(served, "export", "work/b.txt"), port=port)
    with smb.open_file(unc(served, "export", "work/b.txt"), mode="rb", port=port) as f:
        assert f.read() == b"second"
    smb.remove(unc(served, "export", "work/b.txt"), port=port)
    smb.rmdir(unc(served, "export", "work"), port=port)
    assert not (served.mount / "work").exists()


def test_a_directory_of_many_entries_lists_whole(served, smb_session):
    folder = served.mount / "many"
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)  # made by root over the local mount; alice removes an entry below
    started = time.monotonic()
    for i in range(MANY_ENTRIES):
        (folder / f"f{i:05d}").write_bytes(b"")
    created_s = time.monotonic() - started
    started = time.monotonic()
    names = {
        e.name for e in smb_session.scandir(unc(served, "export", "many"), port=served.smb_port)
    }
    listed_s = time.monotonic() - started
    assert names == {f"f{i:05d}" for i in range(MANY_ENTRIES)}, (created_s, listed_s)
    started = time.monotonic()
    out = served.smbclient("export", "alice", "cd many; ls").stdout
    smbclient_s = time.monotonic() - started
    print(
        f"{MANY_ENTRIES} entries: created over the mount in {created_s:.1f} s, listed by "
        f"smbprotocol in {listed_s:.1f} s, by smbclient in {smbclient_s:.1f} s"
    )
    assert sum(1 for line in out.splitlines() if line.strip().startswith("f")) == MANY_ENTRIES
    (folder / "f00000").chmod(0o666)  # Samba refuses to delete a file its user may not write
    smb_session.remove(unc(served, "export", "many/f00000"), port=served.smb_port)
    assert len(os.listdir(folder)) == MANY_ENTRIES - 1


def test_a_user_who_may_not_write_cannot(served):
    shingle(served.config, "smb", "share", "add", "readers", "--read-only-users", "bob")
    served.wait_for(lambda: "[readers]" in (served.data / "smb" / "smb.conf").read_text())
    (served.mount / "for-readers.txt").write_bytes(b"read me")
    served.smbclient("readers", "alice", "put /etc/hostname by-alice.txt")
    out = served.smbclient("readers", "bob", "put /etc/hostname by-bob.txt", check=False).stdout
    assert "NT_STATUS_ACCESS_DENIED" in out or "NT_STATUS_MEDIA_WRITE_PROTECTED" in out, out
    out = served.smbclient("readers", "bob", "del by-alice.txt", check=False).stdout
    assert "NT_STATUS_" in out, out
    assert not (served.mount / "by-bob.txt").exists()
    assert (served.mount / "by-alice.txt").exists()
    got = served.smbclient("readers", "bob", "get for-readers.txt /dev/stdout").stdout
    assert "read me" in got
    # the namespace's own POSIX checks hold too: bob may write the share, not alice's file
    served.smbclient("export", "alice", "put /etc/hostname alices.txt")
    out = served.smbclient("export", "bob", "put /etc/hosts alices.txt", check=False).stdout
    assert "NT_STATUS_ACCESS_DENIED" in out, out
    # a wrong password is refused
    done = served.smbclient("export", None, "ls", check=False)
    assert "NT_STATUS_ACCESS_DENIED" in done.stdout + done.stderr or done.returncode != 0


def test_a_share_limited_by_cidr_refuses_other_addresses(served, monkeypatch):
    import smbclient
    from smbprotocol.exceptions import SMBOSError

    shingle(served.config, "smb", "share", "add", "local", "--clients", "127.0.0.1/32")
    served.wait_for(lambda: "[local]" in (served.data / "smb" / "smb.conf").read_text())
    served.smbclient("local", "alice", "ls")  # smbclient connects from 127.0.0.1
    # smbprotocol connects with socket.create_connection: give it 127.0.0.2 as source address
    monkeypatch.setattr(
        socket,
        "create_connection",
        functools.partial(socket.create_connection, source_address=("127.0.0.2", 0)),
    )
    smbclient.reset_connection_cache()
    try:
        with pytest.raises(SMBOSError) as refused:
            smbclient.listdir(
                unc(served, "local"),
                username="alice",
                password=PASSWORDS["alice"],
                port=served.smb_port,
            )
        assert "ACCESS_DENIED" in str(refused.value) or "0xc0000022" in str(refused.value)
        # the same client from the same address may use the unrestricted share
        smbclient.listdir(
            unc(served, "export"),
            username="alice",
            password=PASSWORDS["alice"],
            port=served.smb_port,
        )
    finally:
        smbclient.reset_connection_cache()


def test_a_file_written_over_nfs_reads_over_smb_at_once_and_back(served, smb_session):
    smb, port = smb_session, served.smb_port
    nfs = _nfs(served, uid=20000, gid=20000)
    path = unc(served, "export", "coherent.txt")
    with nfs.open("/coherent.txt", "wb") as f:
        f.write(b"version 1 from NFS")
    with smb.open_file(path, mode="rb", port=port) as f:
        assert f.read() == b"version 1 from NFS"
    (served.mount / "coherent.txt").stat()  # the kernel now caches its attributes
    for text in (b"v2 NFS, longer than the first one", b"v3 short"):
        with nfs.open("/coherent.txt", "wb") as f:
            f.write(text)
        with smb.open_file(path, mode="rb", port=port) as f:
            assert f.read() == text
        assert (served.mount / "coherent.txt").read_bytes() == text
    # renamed over NFS: the old name is gone over SMB at once
    nfs.rename("/coherent.txt", "/coherent-2.txt")
    assert "coherent.txt" not in smb.listdir(unc(served, "export"), port=port)
    # the mount's kernel caches are dropped by the invalidation thread, not inside the NFS
    # call: on a loaded machine that can take a moment (bounded by the 1 s entry timeout)
    deadline = time.monotonic() + 2.0
    while (served.mount / "coherent.txt").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not (served.mount / "coherent.txt").exists()
    # and the other way round
    with smb.open_file(unc(served, "export", "coherent-2.txt"), mode="wb", port=port) as f:
        f.write(b"from SMB, a new text")
    with nfs.open("/coherent-2.txt", "rb") as f:
        assert f.read() == b"from SMB, a new text"
    nfs.remove("/coherent-2.txt")
    assert "coherent-2.txt" not in smb.listdir(unc(served, "export"), port=port)


def test_guest_share_and_case_insensitive_names(served):
    (served.mount / "public").mkdir()
    (served.mount / "public").chmod(0o777)
    shingle(
        served.config,
        "smb",
        "share",
        "add",
        "public",
        "--path",
        "/public",
        "--guest",
        "--case-insensitive",
    )
    served.wait_for(lambda: "[public]" in (served.data / "smb" / "smb.conf").read_text())
    served.smbclient("public", None, "put /etc/hostname Mixed.TXT")
    assert (served.mount / "public" / "Mixed.TXT").stat().st_uid == 65534  # nobody
    out = served.smbclient("public", None, "get mixed.txt /dev/null", check=False)
    assert out.returncode == 0 and "NT_STATUS" not in out.stdout, out.stdout
    out = served.smbclient("export", None, "ls", check=False)  # not a guest share
    assert out.returncode != 0 or "NT_STATUS" in out.stdout


def test_smbd_is_restarted_when_it_dies(served):
    parents = [
        pid for pid in served.smbd_pids() if os.getppid() != pid and _ppid(pid) == served.proc.pid
    ]
    assert len(parents) == 1, parents
    os.kill(parents[0], signal.SIGKILL)
    served.wait_for(
        lambda: [p for p in served.smbd_pids() if _ppid(p) == served.proc.pid and p != parents[0]],
        30,
        "a new smbd",
    )
    deadline = time.monotonic() + 20
    while served.smbclient("export", "alice", "ls", check=False).returncode != 0:
        assert time.monotonic() < deadline, "smbd did not come back"
        time.sleep(0.5)


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return -1


def test_write_time_set_before_close_is_kept_over_smb(served, smb_session):
    """robocopy and cp -p on a CIFS mount write, set the write time, then close; smbd sets the
    times at the close before the flush commits the data: the time set stays."""
    smb, port = smb_session, served.smb_port
    path = unc(served, "export", "robocopied.bin")
    old_ns = 946_684_800_000_000_000  # 2000-01-01; SMB keeps 100 ns units
    with smb.open_file(path, mode="wb", port=port) as f:
        f.write(b"r" * 100_000)
        f.flush()
        # robocopy sets it on the handle it wrote through, as the close's time would win else
        with SMBFileTransaction(f.raw) as transaction:
            basic = FileBasicInformation()
            filetime = old_ns // 100 + DateTimeField.EPOCH_FILETIME
            basic["last_access_time"] = basic["last_write_time"] = filetime
            set_info(transaction, basic)
    assert smb.stat(path, port=port).st_mtime_ns == old_ns
    time.sleep(CACHE_TIMEOUT_S + 0.5)  # past the kernel's attribute cache of the local mount
    st = (served.mount / "robocopied.bin").stat()
    assert (st.st_mtime_ns, st.st_size) == (old_ns, 100_000)
    smb.remove(path, port=port)


def _smb_tree(smb, served, top: str, below: str = "") -> dict[str, tuple[int, int, str]]:
    """Every file under TOP read over SMB: relative path -> (size, links, sha256)."""
    out = {}
    folder = f"{top}/{below}".rstrip("/")
    for entry in smb.scandir(unc(served, "export", folder), port=served.smb_port):
        name = f"{below}{entry.name}"
        if entry.is_dir():
            out.update(_smb_tree(smb, served, top, name + "/"))
            continue
        path = unc(served, "export", f"{top}/{name}")
        st = smb.stat(path, port=served.smb_port)
        with smb.open_file(path, mode="rb", port=served.smb_port) as f:
            out[name] = (st.st_size, st.st_nlink, hashlib.sha256(f.read()).hexdigest())
    return out


def test_a_snapshot_seen_over_smb_keeps_its_view_through_changes_made_over_smb(served, smb_session):
    """A rename, overwrite, truncate, unlink and hard link made over SMB after a snapshot leave
    DIR/.snapshots/NAME, read over SMB, as it was (size, link count, sha256), and Windows'
    Previous Versions (shadow_copy2) lists the snapshot and opens its bytes."""
    smb, port = smb_session, served.smb_port
    (served.mount / "snapds").mkdir()
    (served.mount / "snapds").chmod(0o777)  # made by root over the mount; alice changes it
    smb.mkdir(unc(served, "export", "snapds/sub"), port=port)
    contents = {f"f{i}": bytes([65 + i]) * (3000 + 1000 * i) for i in range(6)}
    for name, data in contents.items():
        with smb.open_file(unc(served, "export", f"snapds/{name}"), mode="wb", port=port) as f:
            f.write(data)
    smb.link(
        unc(served, "export", "snapds/f0"), unc(served, "export", "snapds/sub/hard0"), port=port
    )
    name = "auto-2026-12-07T0450Z"  # a schedule's name: Previous Versions shows it
    shingle(served.config, "snapshot", "create", "/snapds", name)
    view = f"snapds/.snapshots/{name}"
    before = _smb_tree(smb, served, view)
    assert len(before) == 7 and before["f0"][1] == 2 and before["sub/hard0"] == before["f0"]
    assert before["f3"][0] == 6000, before

    smb.rename(
        unc(served, "export", "snapds/f1"), unc(served, "export", "snapds/sub/f1-moved"), port=port
    )
    with smb.open_file(unc(served, "export", "snapds/f2"), mode="wb", port=port) as f:
        f.write(b"overwritten")
    smb.truncate(unc(served, "export", "snapds/f3"), 5, port=port)
    smb.remove(unc(served, "export", "snapds/f4"), port=port)
    smb.link(
        unc(served, "export", "snapds/f5"), unc(served, "export", "snapds/sub/hard5"), port=port
    )
    live = _smb_tree(smb, served, "snapds")
    assert "f4" not in live and "f1" not in live and live["sub/f1-moved"] == before["f1"]
    assert live["f2"][0] == len(b"overwritten") and live["f3"][0] == 5 and live["f5"][1] == 2
    assert _smb_tree(smb, served, view) == before, "the snapshot's view moved"
    # the view refuses changes over SMB as well
    with pytest.raises(OSError):
        smb.remove(unc(served, "export", f"{view}/f0"), port=port)
    assert _smb_tree(smb, served, view) == before

    # Previous Versions, as Windows asks for it: the versions of a file (FSCTL
    # SRV_ENUMERATE_SNAPSHOTS), then the file opened at one (the @GMT token, a TWrp context)
    token = "@GMT-2026.12.07-04.50.00"
    info = served.smbclient("export", "alice", "allinfo snapds\\f2").stdout
    assert token in info, info
    at = datetime.datetime(2026, 12, 7, 4, 50, tzinfo=datetime.UTC)
    for path in ("f1", "f2", "f3", "f4", "sub/hard0", "sub/f1-moved", "sub/hard5"):
        want = before.get(path, (0, 0, None))[2]  # a name made after the snapshot: none then
        assert _read_previous_version(served, "snapds/" + path, at) == want, path
    shingle(served.config, "snapshot", "delete", "/snapds", name)


def _read_previous_version(served, path: str, at: datetime.datetime) -> str | None:
    """sha256 of PATH as it was at AT, opened as Windows' Previous Versions opens it (an SMB2
    CREATE with a timewarp token); None when it did not exist then."""
    conn = Connection(uuid.uuid4(), "127.0.0.1", served.smb_port)
    conn.connect()
    try:
        session = Session(conn, "alice", PASSWORDS["alice"], require_encryption=False)
        session.connect()
        tree = TreeConnect(session, r"\\127.0.0.1\export")
        tree.connect()
        token = SMB2CreateTimewarpToken()
        token["timestamp"] = at
        context = SMB2CreateContextRequest()
        context["buffer_name"] = CreateContextName.SMB2_CREATE_TIMEWARP_TOKEN
        context["buffer_data"] = token
        opened = Open(tree, path.replace("/", "\\"))
        try:
            opened.create(
                ImpersonationLevel.Impersonation,
                FilePipePrinterAccessMask.GENERIC_READ,
                FileAttributes.FILE_ATTRIBUTE_NORMAL,
                ShareAccess.FILE_SHARE_READ,
                CreateDisposition.FILE_OPEN,
                CreateOptions.FILE_NON_DIRECTORY_FILE,
                create_contexts=[context],
            )
        except SMBResponseException as e:
            if e.status == NtStatus.STATUS_OBJECT_NAME_NOT_FOUND:
                return None
            raise
        data = opened.read(0, opened.end_of_file) if opened.end_of_file else b""
        opened.close()
        return hashlib.sha256(data).hexdigest()
    finally:
        conn.disconnect()
