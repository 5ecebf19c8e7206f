"""Every NFSv3 and MOUNT procedure with hypothesis-drawn arguments (random names and bytes,
huge offsets, counts and sizes, handles valid, mutated, of another export or moved out of
this one, random sattr3): no reply is SERVERFAULT, every reply decodes, and a good client
keeps working meanwhile."""

from __future__ import annotations

import os
import threading

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nfs3_helpers import GARBAGE_ARGS, Rpc3, add_export, nfsrs3, start_server
from xdr_strategies import mutated, names, strategy

from appliance.nfs.v3 import types as t
from engine.namespace import ROOT

EXAMPLES = 2500
MOUNT_PATHS = ["/fuzz", "/fuzz/d", "/fuzz/f", "/export", "/", "/fuzz/../export", "/nope"]


def _mount(peer: Rpc3, path: str) -> bytes:
    status, ok = peer.mount(t.MOUNTPROC3_MNT, path)
    assert status == t.MNT3_OK, (path, status)
    return ok.fhandle


def _lookup(peer: Rpc3, fh: bytes, name: str) -> bytes:
    status, ok = peer.nfs(t.NFSPROC3_LOOKUP, (fh, name))
    assert status == t.NFS3_OK, (name, status)
    return ok.object


def test_every_procedure_with_drawn_arguments(stack, capsys):
    ns = stack.namespace
    top = ns.mkdir(ROOT, ns.root_ino, "fuzzdir", 0o777)
    sub = ns.mkdir(ROOT, top.ino, "d", 0o777)
    f = ns.create(ROOT, top.ino, "f", 0o666)
    ns.write(f.ino, 0, os.urandom(10_000), stable=True)
    ns.symlink(ROOT, top.ino, "link", b"f")
    ns.create(ROOT, sub.ino, "moved", 0o666)
    elsewhere = ns.mkdir(ROOT, ns.root_ino, "elsewhere", 0o777)
    add_export(stack.catalog, name="/export", path="/", clients="127.0.0.1/32")
    add_export(stack.catalog, name="/fuzz", path="/fuzzdir", clients="127.0.0.2/32")
    srv = start_server(stack)
    peer = Rpc3(srv.port, source="127.0.0.2")
    admin = Rpc3(srv.port)
    try:
        root = _mount(peer, "/fuzz")
        d, f_fh = _lookup(peer, root, "d"), _lookup(peer, root, "f")
        link = _lookup(peer, root, "link")
        moved = _lookup(peer, d, "moved")
        ns.rename(ROOT, sub.ino, "moved", elsewhere.ino, "moved")  # now outside the export
        foreign = _lookup(admin, _mount(admin, "/export"), "elsewhere")
        inside, outside = [root, d, f_fh, link], [moved, foreign]
        overrides = {
            "nfs_fh3": st.one_of(
                *[st.sampled_from(inside)] * 6,
                st.sampled_from(outside),
                mutated(inside + outside),
                st.binary(max_size=64),
            ),
            "filename3": names,
            "nfspath3": st.one_of(names, st.sampled_from(["f", "/etc/passwd", "../.."])),
            "dirpath": st.one_of(st.sampled_from(MOUNT_PATHS), names),
        }
        calls = st.one_of(
            *[
                st.sampled_from(sorted(t.ARGS3)).flatmap(
                    lambda proc: st.tuples(
                        st.just(t.NFS_PROGRAM), st.just(proc), strategy(t.ARGS3[proc], overrides)
                    )
                )
            ]
            * 9,
            st.sampled_from(sorted(t.MOUNT_ARGS)).flatmap(
                lambda proc: st.tuples(
                    st.just(t.MOUNT_PROGRAM), st.just(proc), strategy(t.MOUNT_ARGS[proc], overrides)
                )
            ),
        )

        sent, faults = [0], []
        good_errors, good_rounds, stop = [], [0], threading.Event()

        def good_client():
            payload = os.urandom(100_000)
            try:
                with nfsrs3(srv.port) as cl:
                    while not stop.is_set():
                        with cl.open("good", "wb") as out:
                            out.write(payload)
                        with cl.open("good", "rb") as back:
                            if back.read() != payload:
                                good_errors.append(f"round {good_rounds[0]}: bytes differ")
                        good_rounds[0] += 1
            except Exception as exc:  # noqa: BLE001 - any error of the good client fails the test
                good_errors.append(repr(exc))

        worker = threading.Thread(target=good_client)
        worker.start()

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(calls)
        def one(call):
            prog, proc, args = call
            mount = prog == t.MOUNT_PROGRAM
            argtype = (t.MOUNT_ARGS if mount else t.ARGS3)[proc]
            vers = t.MOUNT_V3 if mount else t.NFS_V3
            stat, body = peer.call_bytes(prog, vers, proc, argtype.encode(args))
            sent[0] += 1
            if stat == GARBAGE_ARGS:  # an enum value outside its declared set: rightly refused
                return
            assert stat == 0, f"accept_stat {stat}"
            if mount:
                value = t.MOUNT_RESULTS[proc].decode(body)
                fault = proc == t.MOUNTPROC3_MNT and value[0] == t.MNT3ERR_SERVERFAULT
            else:
                value = t.RESULTS3[proc][0].decode(body)  # NULL: None
                fault = value is not None and value[0] == t.NFS3ERR_SERVERFAULT
            if fault:
                faults.append((prog, proc, args))
            assert not fault, (t.PROC3_NAMES.get(proc, proc), args)

        try:
            one()
        finally:
            stop.set()
            worker.join(60)
        with capsys.disabled():
            print(
                f"\nNFSv3 and MOUNT procedure fuzz: {sent[0]} calls, no SERVERFAULT; "
                f"the good client did {good_rounds[0]} rounds"
            )
        assert not faults
        assert not good_errors, good_errors[:3]
        assert good_rounds[0] >= 1
        assert sent[0] >= EXAMPLES // 2
        assert peer.nfs(t.NFSPROC3_GETATTR, root)[0] == t.NFS3_OK
        with nfsrs3(srv.port) as cl:
            assert "good" in cl.listdir(".")
    finally:
        peer.close()
        admin.close()
        srv.stop()
