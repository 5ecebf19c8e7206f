"""NFSv3 and MOUNT protocol behaviour the real clients do not expose:
malformed calls, foreign clients, bad handles, write stability and the
write verifier, CREATE modes, READDIR sizing, FSINFO limits."""

from __future__ import annotations

import os
import struct
import time

from nfs3_helpers import GARBAGE_ARGS, Rpc3, add_export, libnfs, nfs_url, start_server

from appliance.nfs.v3 import types as t

NO_ATTRS = t.NO_ATTRS


def mount_root(peer: Rpc3, path: str = "/export") -> bytes:
    status, ok = peer.mount(t.MOUNTPROC3_MNT, path)
    assert status == t.MNT3_OK, status
    return ok.fhandle


def sattr(mode=None, size=None):
    return t.sattr3.cls(mode, None, None, size, (t.DONT_CHANGE, None), (t.DONT_CHANGE, None))


def create(peer, dir_fh, name, how=(t.UNCHECKED, NO_ATTRS)):
    return peer.nfs(t.NFSPROC3_CREATE, t.CREATE3args.cls(t.diropargs3.cls(dir_fh, name), how))


def test_malformed_calls_get_garbage_args_and_the_server_stays_up(server, rpc):
    peer = rpc()
    root = mount_root(peer)
    good = t.ARGS3[t.NFSPROC3_LOOKUP].encode((root, "x"))
    # a handle longer than NFS3_FHSIZE, a body cut short, bytes after the arguments
    for body in (
        struct.pack(">I", 200) + b"\0" * 200 + struct.pack(">I", 1) + b"x\0\0\0",
        good[:-6],
        good + b"\0\0\0\0",
    ):
        stat, rest = peer.call_bytes(t.NFS_PROGRAM, t.NFS_V3, t.NFSPROC3_LOOKUP, body)
        assert (stat, rest) == (GARBAGE_ARGS, b"")
    stat, _ = peer.call_bytes(t.NFS_PROGRAM, t.NFS_V3, t.NFSPROC3_WRITE, b"\xff" * 7)
    assert stat == GARBAGE_ARGS
    stat, _ = peer.call_bytes(
        t.MOUNT_PROGRAM, t.MOUNT_V3, t.MOUNTPROC3_MNT, struct.pack(">I", 5000)
    )
    assert stat == GARBAGE_ARGS  # a path longer than MNTPATHLEN
    stat, _ = peer.call_bytes(t.NFS_PROGRAM, t.NFS_V3, 22, b"")
    assert stat == 3  # PROC_UNAVAIL
    # the same connection and new clients carry on
    assert peer.call_bytes(t.NFS_PROGRAM, t.NFS_V3, t.NFSPROC3_NULL, b"") == (0, b"")
    status, attrs = peer.nfs(t.NFSPROC3_GETATTR, root)
    assert status == t.NFS3_OK and attrs.type == t.NF3DIR
    assert libnfs("nfs-ls", nfs_url(server.port)).returncode == 0


def test_client_outside_the_export_networks_is_refused(stack):
    add_export(stack.catalog, clients="127.0.0.1/32")
    srv = start_server(stack, host="0.0.0.0")
    local = Rpc3(srv.port)
    foreign = Rpc3(srv.port, source="127.0.0.2")
    try:
        status, _ = foreign.mount(t.MOUNTPROC3_MNT, "/export")
        assert status == t.MNT3ERR_ACCES
        root = mount_root(local)
        # a genuine handle does not help a foreign client
        status, _ = foreign.nfs(t.NFSPROC3_GETATTR, root)
        assert status == t.NFS3ERR_ACCES
        status, _ = foreign.nfs(t.NFSPROC3_LOOKUP, (root, "anything"))
        assert status == t.NFS3ERR_ACCES
        status, _ = local.nfs(t.NFSPROC3_GETATTR, root)
        assert status == t.NFS3_OK
    finally:
        local.close()
        foreign.close()
        srv.stop()


def test_missing_bad_and_stale_handles(server, rpc):
    peer = rpc()
    root = mount_root(peer)
    assert peer.mount(t.MOUNTPROC3_MNT, "/nope")[0] == t.MNT3ERR_NOENT
    status, fail = peer.nfs(t.NFSPROC3_LOOKUP, (root, "missing"))
    assert status == t.NFS3ERR_NOENT
    assert peer.nfs(t.NFSPROC3_GETATTR, os.urandom(len(root)))[0] == t.NFS3ERR_BADHANDLE
    tampered = root[:-1] + bytes([root[-1] ^ 1])
    assert peer.nfs(t.NFSPROC3_GETATTR, tampered)[0] == t.NFS3ERR_BADHANDLE
    status, ok = create(peer, root, "doomed")
    assert status == t.NFS3_OK
    doomed = ok.obj
    assert peer.nfs(t.NFSPROC3_REMOVE, (root, "doomed"))[0] == t.NFS3_OK
    assert peer.nfs(t.NFSPROC3_GETATTR, doomed)[0] == t.NFS3ERR_STALE
    assert peer.nfs(t.NFSPROC3_RMDIR, (root, "doomed"))[0] == t.NFS3ERR_NOENT
    status, _ = peer.nfs(t.NFSPROC3_READ, t.READ3args.cls(root, 0, 10))
    assert status == t.NFS3ERR_ISDIR


def test_mount_subdirectories_dump_and_umount(server, rpc):
    peer = rpc()
    root = mount_root(peer)
    status, made = peer.nfs(
        t.NFSPROC3_MKDIR, t.MKDIR3args.cls(t.diropargs3.cls(root, "sub"), NO_ATTRS)
    )
    assert status == t.NFS3_OK
    assert create(peer, made.obj, "plain")[0] == t.NFS3_OK
    assert mount_root(peer, "/export/sub/") == made.obj
    assert peer.mount(t.MOUNTPROC3_MNT, "/export/sub/plain")[0] == t.MNT3ERR_NOTDIR
    assert peer.mount(t.MOUNTPROC3_MNT, "/export/sub/none")[0] == t.MNT3ERR_NOENT
    # ".." stops at the export's root
    status, up = peer.nfs(t.NFSPROC3_LOOKUP, (root, ".."))
    assert status == t.NFS3_OK and up.object == root
    assert sorted(m.ml_directory for m in peer.mount(t.MOUNTPROC3_DUMP)) == [
        "/export",
        "/export/sub",
    ]
    peer.mount(t.MOUNTPROC3_UMNT, "/export/sub")
    assert [m.ml_directory for m in peer.mount(t.MOUNTPROC3_DUMP)] == ["/export"]
    peer.mount(t.MOUNTPROC3_UMNTALL)
    assert peer.mount(t.MOUNTPROC3_DUMP) == []
    assert [(e.ex_dir, e.ex_groups) for e in peer.mount(t.MOUNTPROC3_EXPORT)] == [
        ("/export", ["127.0.0.1/32"])
    ]


def test_write_stability_verifier_and_commit(server, rpc):
    peer = rpc()
    root = mount_root(peer)
    fh = create(peer, root, "w.bin")[1].obj
    verifier = server.server.write_verifier
    status, ok = peer.nfs(t.NFSPROC3_WRITE, t.WRITE3args.cls(fh, 0, 5, t.UNSTABLE, b"hello"))
    assert status == t.NFS3_OK and (ok.count, ok.committed, ok.verf) == (5, t.UNSTABLE, verifier)
    assert ok.file_wcc.before.size == 0 and ok.file_wcc.after.size == 5
    status, ok = peer.nfs(t.NFSPROC3_WRITE, t.WRITE3args.cls(fh, 5, 6, t.DATA_SYNC, b" world"))
    assert status == t.NFS3_OK and ok.committed == t.FILE_SYNC and ok.verf == verifier
    status, ok = peer.nfs(t.NFSPROC3_COMMIT, t.COMMIT3args.cls(fh, 0, 0))
    assert status == t.NFS3_OK and ok.verf == verifier
    status, ok = peer.nfs(t.NFSPROC3_READ, t.READ3args.cls(fh, 0, 100))
    assert status == t.NFS3_OK and (bytes(ok.data), ok.eof) == (b"hello world", True)
    status, ok = peer.nfs(t.NFSPROC3_READ, t.READ3args.cls(fh, 0, 5))
    assert (bytes(ok.data), ok.eof) == (b"hello", False)
    # a count larger than the data sent is refused, nothing written
    status, _ = peer.nfs(t.NFSPROC3_WRITE, t.WRITE3args.cls(fh, 0, 9, t.FILE_SYNC, b"abc"))
    assert status == t.NFS3ERR_INVAL
    assert peer.nfs(t.NFSPROC3_GETATTR, fh)[1].size == 11
    status, info = peer.nfs(t.NFSPROC3_FSINFO, root)
    assert status == t.NFS3_OK and (info.rtmax, info.wtmax) == (1 << 20, 1 << 20)
    status, fs = peer.nfs(t.NFSPROC3_FSSTAT, root)
    assert status == t.NFS3_OK and 0 < fs.fbytes <= fs.tbytes
    status, pc = peer.nfs(t.NFSPROC3_PATHCONF, root)
    assert status == t.NFS3_OK and pc.name_max == 255 and pc.case_preserving


def test_create_modes_mknod_and_setattr_guard(server, rpc):
    peer = rpc()
    root = mount_root(peer)
    status, ok = create(peer, root, "g", (t.GUARDED, sattr(mode=0o600)))
    assert status == t.NFS3_OK and ok.obj_attributes.mode == 0o600
    assert create(peer, root, "g", (t.GUARDED, NO_ATTRS))[0] == t.NFS3ERR_EXIST
    # EXCLUSIVE: a retransmission with the same verifier succeeds with the same file
    first = create(peer, root, "x", (t.EXCLUSIVE, b"verifier"))
    again = create(peer, root, "x", (t.EXCLUSIVE, b"verifier"))
    assert first[0] == again[0] == t.NFS3_OK and first[1].obj == again[1].obj
    assert create(peer, root, "x", (t.EXCLUSIVE, b"other-vf"))[0] == t.NFS3ERR_EXIST
    # UNCHECKED on an existing file applies only the size
    fh = first[1].obj
    peer.nfs(t.NFSPROC3_WRITE, t.WRITE3args.cls(fh, 0, 4, t.FILE_SYNC, b"data"))
    status, ok = create(peer, root, "x", (t.UNCHECKED, sattr(size=0)))
    assert status == t.NFS3_OK and ok.obj == fh and ok.obj_attributes.size == 0
    status, ok = peer.nfs(
        t.NFSPROC3_MKNOD,
        t.MKNOD3args.cls(t.diropargs3.cls(root, "pipe"), (t.NF3FIFO, sattr(0o640))),
    )
    assert (
        status == t.NFS3_OK
        and ok.obj_attributes.type == t.NF3FIFO
        and ok.obj_attributes.mode == 0o640
    )
    status, _ = peer.nfs(
        t.NFSPROC3_MKNOD, t.MKNOD3args.cls(t.diropargs3.cls(root, "reg"), (t.NF3REG, None))
    )
    assert status == t.NFS3ERR_BADTYPE
    ctime = peer.nfs(t.NFSPROC3_GETATTR, fh)[1].ctime
    wrong = t.nfstime3.cls(ctime.seconds + 1, ctime.nseconds)
    status, _ = peer.nfs(t.NFSPROC3_SETATTR, t.SETATTR3args.cls(fh, sattr(mode=0o600), wrong))
    assert status == t.NFS3ERR_NOT_SYNC
    status, wcc = peer.nfs(t.NFSPROC3_SETATTR, t.SETATTR3args.cls(fh, sattr(mode=0o600), ctime))
    assert status == t.NFS3_OK and wcc.after.mode == 0o600
    status, acc = peer.nfs(t.NFSPROC3_ACCESS, t.ACCESS3args.cls(root, 0x3F))
    assert (
        status == t.NFS3_OK
        and acc.access
        == t.ACCESS3_READ
        | t.ACCESS3_LOOKUP
        | t.ACCESS3_MODIFY
        | t.ACCESS3_EXTEND
        | t.ACCESS3_DELETE
    )


def test_readdir_pages_by_count(server, rpc):
    peer = rpc()
    root = mount_root(peer)
    names = {f"n{i:03d}" for i in range(60)}
    for name in names:
        assert create(peer, root, name)[0] == t.NFS3_OK
    seen, cookie, pages = [], 0, 0
    while True:
        status, ok = peer.nfs(t.NFSPROC3_READDIR, t.READDIR3args.cls(root, cookie, b"\0" * 8, 512))
        assert status == t.NFS3_OK and len(t.READDIR3resok.encode(ok)) <= 512
        pages += 1
        seen += [e.name for e in ok.entries]
        if ok.eof:
            break
        cookie = ok.entries[-1].cookie
    assert sorted(seen) == sorted(names) and pages > 3
    status, _ = peer.nfs(t.NFSPROC3_READDIR, t.READDIR3args.cls(root, 0, b"\0" * 8, 100))
    assert status == t.NFS3ERR_TOOSMALL
    status, ok = peer.nfs(
        t.NFSPROC3_READDIRPLUS, t.READDIRPLUS3args.cls(root, 0, b"\0" * 8, 4096, 65536)
    )
    assert status == t.NFS3_OK and ok.entries
    for entry in ok.entries:
        status, attrs = peer.nfs(t.NFSPROC3_GETATTR, entry.name_handle)
        assert status == t.NFS3_OK and attrs.fileid == entry.fileid == entry.name_attributes.fileid


def test_identities_are_squashed_per_export(stack):
    add_export(stack.catalog)  # no_root_squash: the administrator
    add_export(stack.catalog, name="/squashed", squash="root_squash", anon_uid=4000, anon_gid=4001)
    srv = start_server(stack)
    admin, root_user, user = (
        Rpc3(srv.port),
        Rpc3(srv.port, uid=0, gid=0),
        Rpc3(srv.port, uid=1000, gid=1000),
    )
    try:
        top = mount_root(admin)
        squashed = mount_root(root_user, "/squashed")
        # root is squashed to 4000: the root-owned 0755 directory does not let it in
        assert create(root_user, squashed, "as-root")[0] == t.NFS3ERR_ACCES
        assert (
            admin.nfs(t.NFSPROC3_SETATTR, t.SETATTR3args.cls(top, sattr(mode=0o1777), None))[0]
            == t.NFS3_OK
        )
        status, ok = create(root_user, squashed, "as-root")
        assert status == t.NFS3_OK and (ok.obj_attributes.uid, ok.obj_attributes.gid) == (
            4000,
            4001,
        )
        status, ok = create(user, mount_root(user, "/squashed"), "as-user")
        assert status == t.NFS3_OK and (ok.obj_attributes.uid, ok.obj_attributes.gid) == (
            1000,
            1000,
        )
        # the sticky directory keeps user 1000 from removing root's (squashed) file
        assert user.nfs(t.NFSPROC3_REMOVE, (squashed, "as-root"))[0] == t.NFS3ERR_PERM
        status, acc = user.nfs(t.NFSPROC3_ACCESS, t.ACCESS3args.cls(ok.obj, 0x3F))
        assert status == t.NFS3_OK and acc.access & t.ACCESS3_MODIFY
    finally:
        for peer in (admin, root_user, user):
            peer.close()
        srv.stop()


def test_mtime_set_between_unstable_writes_and_commit_is_kept(server, rpc):
    """cp -p, rsync -t and tar x over NFSv3: UNSTABLE WRITEs, SETATTR of the times, COMMIT at
    close. The COMMIT records the writes but keeps the mtime the client set."""
    peer = rpc()
    root = mount_root(peer)
    fh = create(peer, root, "copied")[1].obj
    status, _ = peer.nfs(t.NFSPROC3_WRITE, t.WRITE3args.cls(fh, 0, 5, t.UNSTABLE, b"hello"))
    assert status == t.NFS3_OK
    old = t.nfstime3.cls(946_684_800, 123_456_789)  # 2000-01-01
    times = t.sattr3.cls(
        None, None, None, None, (t.SET_TO_CLIENT_TIME, old), (t.SET_TO_CLIENT_TIME, old)
    )
    status, wcc = peer.nfs(t.NFSPROC3_SETATTR, t.SETATTR3args.cls(fh, times, None))
    assert status == t.NFS3_OK and wcc.after.mtime == old
    status, _ = peer.nfs(t.NFSPROC3_COMMIT, t.COMMIT3args.cls(fh, 0, 0))
    assert status == t.NFS3_OK
    status, attrs = peer.nfs(t.NFSPROC3_GETATTR, fh)
    assert status == t.NFS3_OK and (attrs.mtime, attrs.size) == (old, 5)
    # without a SETATTR, the mtime is the write's time, not the COMMIT's
    before = time.time_ns() // 10**9
    status, _ = peer.nfs(t.NFSPROC3_WRITE, t.WRITE3args.cls(fh, 5, 1, t.UNSTABLE, b"!"))
    written = peer.nfs(t.NFSPROC3_GETATTR, fh)[1].mtime
    time.sleep(0.05)
    status, _ = peer.nfs(t.NFSPROC3_COMMIT, t.COMMIT3args.cls(fh, 0, 0))
    assert status == t.NFS3_OK
    committed = peer.nfs(t.NFSPROC3_GETATTR, fh)[1].mtime
    assert committed == written and committed.seconds >= before
