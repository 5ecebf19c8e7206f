"""The NFSv4 operation registry (appliance/nfs/v4/registry.py): every operation of NFSv4.0, 4.1
and 4.2 has one entry, its facts agree with each other, with the XDR declarations and with the
handlers registered, and a real server answers by them: what an operation gets before its
handler runs (OP_ILLEGAL, NOTSUPP, OP_NOT_IN_SESSION, SEQUENCE_POS, NOFILEHANDLE) follows from
its entry alone."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nfs4_rawclient import RawClient
from nfs4_support import add_export, start_server
from xdr_strategies import strategy

from appliance.nfs.v4 import (
    compound40,
    program,  # noqa: F401 - registers every handler
)
from appliance.nfs.v4 import const as c
from appliance.nfs.v4 import types as t
from appliance.nfs.v4.registry import TABLE, operation, operation40

MINORS = (c.MINOR_VERSION_40, c.MINOR_VERSION, c.MINOR_VERSION_42)
FACTS = ("needs_fh", "sessionless", "from_cache", "keeps_stateid", "mutating")


def _runs_anywhere(op) -> bool:
    return bool(op.minors)


def test_every_operation_of_the_protocol_has_one_entry():
    protocol = set(range(c.OP_ACCESS, c.LAST_OP_42 + 1))
    assert protocol == {n for n in c.OP_NAMES if n != c.OP_ILLEGAL}
    assert set(TABLE) == protocol
    assert all(TABLE[n].opnum == n for n in TABLE)


def test_an_operation_runs_only_where_it_is_defined_and_stays_in_later_minors():
    for op in TABLE.values():
        assert all(m >= op.since for m in op.minors), op.name
        # NFSv4.0's client ids and owner seqids went in 4.1: what 4.1 runs, 4.2 runs too
        if c.MINOR_VERSION in op.minors:
            assert c.MINOR_VERSION_42 in op.minors, op.name
        if op.since == c.MINOR_VERSION_40 and c.MINOR_VERSION_40 not in op.minors:
            assert not op.minors, f"{op.name}: served in 4.1 but not in 4.0"


def test_each_operation_run_has_its_arguments_type_and_a_handler():
    for op in TABLE.values():
        if not _runs_anywhere(op):
            assert op.handler is None and op.handler40 is None, op.name
            continue
        assert op.opnum in t.ARGS, op.name  # (a result of the status alone needs no type)
        if set(op.minors) & {c.MINOR_VERSION, c.MINOR_VERSION_42}:
            # SEQUENCE is the executor's own (slot table and reply cache)
            assert (op.handler is None) == (op.opnum == c.OP_SEQUENCE), op.name
        if c.MINOR_VERSION_40 in op.minors:
            assert op.handler40 is not None or op.handler is not None, op.name
        else:
            assert op.handler40 is None, op.name


def test_the_facts_agree_with_each_other():
    for op in TABLE.values():
        facts = {name for name in FACTS if getattr(op, name)}
        if not _runs_anywhere(op):
            assert not facts, f"{op.name} runs nowhere but declares {facts}"
        if op.sessionless:  # the first operation of a COMPOUND, before any PUTFH
            assert op.since == c.MINOR_VERSION and not op.needs_fh, op.name
        if op.from_cache:  # the event loop's attempt is NFSv4.1's alone
            assert c.MINOR_VERSION in op.minors, op.name
    assert {op.opnum for op in TABLE.values() if op.keeps_stateid} == {c.OP_OPEN, c.OP_RESTOREFH}
    # the NFSv4.0 operations that carry an owner's seqid change state and name a file
    for opnum in compound40.SEQUENCERS:
        op = TABLE[opnum]
        assert op.mutating and op.needs_fh and c.MINOR_VERSION_40 in op.minors, op.name


def test_a_handler_registers_once():
    op = TABLE[c.OP_GETATTR]
    before = (op.handler, op.handler40)
    with pytest.raises(ValueError, match="GETATTR registered twice"):
        operation(c.OP_GETATTR)(lambda cx, args: None)
    with pytest.raises(ValueError, match="GETATTR registered twice"):
        operation40(c.OP_GETATTR)(lambda cx, args: None)
    assert (op.handler, op.handler40) == before


# -- on the wire ------------------------------------------------------------------------------
def _expected(op, minor: int, in_session: bool) -> int | None:
    """What the executor answers ``op`` with before its handler runs, sent without a current
    file handle (after SEQUENCE when ``in_session``); None when the handler decides."""
    if op.since > minor:
        return c.NFS4ERR_OP_ILLEGAL
    if minor not in op.minors:
        return c.NFS4ERR_NOTSUPP
    if minor != c.MINOR_VERSION_40:
        if op.opnum == c.OP_SEQUENCE:  # first, it checks its own arguments
            return c.NFS4ERR_SEQUENCE_POS if in_session else None
        if not in_session:
            return None if op.sessionless else c.NFS4ERR_OP_NOT_IN_SESSION
    elif op.opnum in compound40.SEQUENCERS:
        return None  # its owner is looked up first (a made-up one: STALE_CLIENTID ...)
    return c.NFS4ERR_NOFILEHANDLE if op.needs_fh else None


def _args(opnum: int):
    if opnum not in t.ARGS:  # answered without decoding: no arguments follow
        return st.none()
    return strategy(t.ARGS[opnum], {"sessionid4": st.binary(min_size=16, max_size=16)})


def test_the_server_answers_by_the_registry(stack):
    """Every operation in each minor version, first in the COMPOUND and after SEQUENCE, its
    arguments drawn: the status its entry predicts. A session-less operation alone runs for
    real, so those are sent after SEQUENCE only."""
    add_export(stack.catalog)
    srv = start_server(stack)
    raw = RawClient(srv.port).setup()
    checked: dict[int, int] = {}
    wrong: list = []  # (operation, minor version, first, (status, last op, its status))

    @settings(max_examples=3, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.data())
    def every_operation(data):
        wrong.clear()
        for opnum, minor, first in itertools.product(sorted(TABLE), MINORS, (True, False)):
            op = TABLE[opnum]
            in_session = (not first or op.sessionless) and minor != c.MINOR_VERSION_40
            expected = _expected(op, minor, in_session)
            if expected is None:
                continue
            head = [raw.sequence_op()] if in_session else []
            args = data.draw(_args(opnum))
            status, results = raw.parse(raw.call_raw(1, _with_op(raw, head, minor, opnum, args)))
            if in_session and results[0][1] != c.NFS4_OK:
                raw.seq[0] -= 1  # the slot did not move on: that seqid again next time
            want_op = c.OP_ILLEGAL if expected == c.NFS4ERR_OP_ILLEGAL else opnum
            got = (status, results[-1][0], results[-1][1])
            if got != (expected, want_op, expected):
                wrong.append((op.name, minor, first, got))
            checked[expected] = checked.get(expected, 0) + 1
        assert not wrong, wrong

    try:
        every_operation()
    finally:
        raw.close()
        srv.stop()
    assert set(checked) == {
        c.NFS4ERR_OP_ILLEGAL,
        c.NFS4ERR_NOTSUPP,
        c.NFS4ERR_OP_NOT_IN_SESSION,
        c.NFS4ERR_SEQUENCE_POS,
        c.NFS4ERR_NOFILEHANDLE,
    }, checked


def _with_op(raw: RawClient, head: list, minor: int, opnum: int, args) -> bytes:
    """A COMPOUND of ``head`` then ``opnum`` with ``args`` packed by its XDR type, or with no
    arguments for an operation the protocol declares but this server never decodes."""
    if opnum in t.ARGS:
        return raw.compound_bytes([*head, (opnum, args)], minor)
    body = bytearray(raw.compound_bytes([*head, (c.OP_PUTROOTFH, None)], minor))
    body[-4:] = opnum.to_bytes(4, "big")  # PUTROOTFH has no arguments: its number was last
    return bytes(body)
