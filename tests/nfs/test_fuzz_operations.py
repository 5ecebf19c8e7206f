"""Well-formed COMPOUNDs of every NFSv4.1 and NFSv4.2 operation (minor version 1 or 2, drawn:
4.2's operations in a minor 1 COMPOUND meet OP_ILLEGAL) with hypothesis-drawn arguments (random
names and bytes, huge offsets, lengths and sizes, handles valid, mutated, of another export or
moved out of this one, stateids real and made up, random bitmaps and attributes), inside a
real session: no reply is SERVERFAULT, every reply decodes, and a good client keeps working
meanwhile. Where test_fuzz.py mutates bytes (the decoder's side), this reaches the handlers."""

from __future__ import annotations

import os
import threading

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nfs4_rawclient import RawClient, open_args
from nfs4_support import add_export, nfsrs, start_server
from xdr_strategies import integers, mutated, names, strategy

from appliance.nfs.v4 import attrs as fattr
from appliance.nfs.v4 import const as c
from appliance.nfs.v4 import types as t
from engine.namespace import ROOT

EXAMPLES = 2500
# the operations that must be alone in a COMPOUND without SEQUENCE; the rest follow one
SESSIONLESS = (
    c.OP_EXCHANGE_ID,
    c.OP_CREATE_SESSION,
    c.OP_DESTROY_SESSION,
    c.OP_BIND_CONN_TO_SESSION,
    c.OP_DESTROY_CLIENTID,
)


def _fattr_values(bits_values) -> tuple:
    bits = sorted({bit for bit, _ in bits_values})
    by_bit = dict(bits_values)
    values = b"".join(fattr.ATTRS[bit][0].encode(by_bit[bit]) for bit in bits)
    return (fattr.to_bitmap(bits), values)


def _fattr_strategy(overrides) -> st.SearchStrategy:
    """Attribute lists of settable attributes with drawn values (mostly well-formed: a
    random mask and bytes are also drawn, and meet the decoder)."""
    settable = sorted(bit for bit, spec in fattr.ATTRS.items() if spec[2])
    one = st.sampled_from(settable).flatmap(
        lambda bit: st.tuples(st.just(bit), strategy(fattr.ATTRS[bit][0], overrides))
    )
    valid = st.lists(one, max_size=4).map(_fattr_values)
    anything = st.tuples(st.lists(integers(0, 0xFFFFFFFF), max_size=3), st.binary(max_size=64))
    return st.one_of(valid, valid, anything)


def _setup_tree(stack):
    ns = stack.namespace
    top = ns.mkdir(ROOT, ns.root_ino, "fuzzdir", 0o777)
    sub = ns.mkdir(ROOT, top.ino, "d", 0o777)
    f = ns.create(ROOT, top.ino, "f", 0o666)
    ns.write(f.ino, 0, os.urandom(10_000), stable=True)
    ns.symlink(ROOT, top.ino, "link", b"f")
    ns.create(ROOT, sub.ino, "moved", 0o666)
    ns.mkdir(ROOT, ns.root_ino, "elsewhere", 0o777)
    return top, sub


def test_every_operation_with_drawn_arguments(stack, capsys):
    add_export(stack.catalog, name="/export", path="/", clients="127.0.0.1/32")
    top, sub = _setup_tree(stack)
    add_export(stack.catalog, name="/fuzz", path="/fuzzdir", clients="127.0.0.2/32")
    srv = start_server(stack)
    ns = stack.namespace
    raw = RawClient(srv.port, source="127.0.0.2").setup()
    admin = RawClient(srv.port).setup()
    try:

        def fh(client, *path):
            ops = [(c.OP_PUTROOTFH, None)] + [(c.OP_LOOKUP, p) for p in path] + [(c.OP_GETFH, None)]
            st_, res = client.session(ops)
            assert st_ == 0, (path, res)
            return res[-1][2]

        root, d, f, link = (
            fh(raw, "fuzz"),
            fh(raw, "fuzz", "d"),
            fh(raw, "fuzz", "f"),
            fh(raw, "fuzz", "link"),
        )
        moved = fh(raw, "fuzz", "d", "moved")
        ns.rename(ROOT, sub.ino, "moved", ns.resolve("/elsewhere").ino, "moved")  # now outside
        foreign = fh(admin, "export", "elsewhere")  # an export this client may not use
        opened = (c.OP_OPEN, open_args("f", b"fz", raw.clientid))
        st_, res = raw.session([(c.OP_PUTFH, root), opened, (c.OP_GETFH, None)])
        assert st_ == 0, res
        sid = res[2][2].stateid
        inside, outside = [root, d, f, link], [moved, foreign]
        handles = inside + outside
        stateids = st.one_of(
            st.sampled_from(
                [
                    t.stateid4.cls(sid.seqid, sid.other),
                    t.stateid4.cls(0, sid.other),
                    t.stateid4.cls(0, b"\0" * 12),
                    t.stateid4.cls(1, b"\0" * 12),
                    t.stateid4.cls(0xFFFFFFFF, b"\xff" * 12),
                ]
            ),
            st.tuples(integers(0, 0xFFFFFFFF), st.binary(min_size=12, max_size=12)),
            st.tuples(
                integers(0, 0xFFFFFFFF), mutated([bytes(sid.other)]).filter(lambda b: len(b) == 12)
            ),
        )
        overrides = {
            "nfs_fh4": st.one_of(
                *[st.sampled_from(inside)] * 6,
                st.sampled_from(outside),
                mutated(handles),
                st.binary(max_size=128),
            ),
            "component4": names,
            "stateid4": stateids,
            "sessionid4": st.binary(min_size=16, max_size=16),  # never destroys its own
        }
        overrides["fattr4"] = _fattr_strategy(overrides)
        in_session = sorted(op for op in t.ARGS if op not in SESSIONLESS)

        def op(opnum):
            return st.tuples(st.just(opnum), strategy(t.ARGS[opnum], overrides))

        # the current and saved handles set (mostly to ones this client may use), then one to
        # three operations; one in ten COMPOUNDs is a session-less operation alone
        current = st.one_of(*[st.sampled_from(inside)] * 8, st.sampled_from(outside))
        in_a_session = st.tuples(
            current,
            current,
            st.lists(st.sampled_from(in_session).flatmap(op), min_size=1, max_size=3),
        )
        alone = st.sampled_from(SESSIONLESS).flatmap(op).map(lambda one: (None, None, [one]))
        compound = st.tuples(st.one_of(*[in_a_session] * 9, alone), st.sampled_from([1, 2]))

        sent = [0]
        faults = []
        good_errors, good_rounds, stop = [], [0], threading.Event()

        def good_client():
            payload = os.urandom(100_000)
            try:
                with nfsrs(srv.port) as cl:
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
        @given(compound)
        def one(drawn):
            (current, saved, ops), minor = drawn
            if current is None:  # a session-less operation alone
                body = raw.compound_bytes(ops, minor)
            else:
                body = raw.compound_bytes(
                    [
                        raw.sequence_op(),
                        (c.OP_PUTFH, saved),
                        (c.OP_SAVEFH, None),
                        (c.OP_PUTFH, current),
                        *ops,
                    ],
                    minor,
                )
            reply = raw.call_raw(1, body)
            sent[0] += 1
            status, results = raw.parse(reply)
            if current is not None and results[0][1] != c.NFS4_OK:
                raw.seq[0] -= 1  # the slot did not move on: send that seqid again
            for opnum, op_status, _ in results:
                if op_status == c.NFS4ERR_SERVERFAULT:
                    faults.append((c.OP_NAMES.get(opnum), ops))
            assert status != c.NFS4ERR_SERVERFAULT, faults[-1]

        try:
            one()
        finally:
            stop.set()
            worker.join(60)
        with capsys.disabled():
            print(
                f"\nNFSv4.1/4.2 operation fuzz: {sent[0]} COMPOUNDs, no SERVERFAULT; "
                f"the good client did {good_rounds[0]} rounds"
            )
        assert not faults
        assert not good_errors, good_errors[:3]
        assert good_rounds[0] >= 1
        assert sent[0] >= EXAMPLES // 2
        # still serving: the session works, a fresh client too
        assert raw.session([(c.OP_PUTFH, root), (c.OP_GETATTR, [1 << c.FATTR4_TYPE])])[0] == 0
        with nfsrs(srv.port) as cl:
            assert "good" in cl.listdir(".")
    finally:
        raw.close()
        admin.close()
        srv.stop()
