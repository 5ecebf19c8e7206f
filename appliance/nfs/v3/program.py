"""Program 100003 version 3: decodes a call's arguments, runs its procedure in a worker
thread and encodes the result, a failure becoming the procedure's NFS3ERR_* status."""

from __future__ import annotations

import logging
import time

from appliance.nfs.access import log_failure
from appliance.nfs.onc.rpc import (
    PROC_UNAVAIL,
    AuthTooWeak,
    InWorker,
    RpcReject,
    accepted,
    decode_args,
)
from appliance.nfs.onc.xdr import Packer, XdrError
from appliance.nfs.v3 import types as t
from appliance.nfs.v3.context import CODES, Call3, status_of
from appliance.nfs.v3.procedures import HANDLERS3

log = logging.getLogger("shingle.nfs.v3")


def execute(server, rpc_cred, address: str, proc: int, args) -> list:
    """Run one NFSv3 procedure; returns the reply body chunks."""
    rtype, fail = t.RESULTS3[proc]
    cx = Call3(server, rpc_cred, address)
    name = t.PROC3_NAMES.get(proc, proc)
    started = time.perf_counter()
    try:
        value = HANDLERS3[proc](cx, args)
        status = t.NFS3_OK
    except AuthTooWeak:
        raise  # an RPC-level denial (appliance/nfs/onc/connection.py), not an NFS3ERR status
    except Exception as exc:  # noqa: BLE001 - every failure becomes a status, never a dead connection
        status = status_of(exc)
        log_failure(CODES, status, f"NFSv3 {name}", address, exc)
        value = fail
    elapsed = time.perf_counter() - started
    server.counters.op_done(f"v3_{str(name).lower()}", elapsed, cx.export_id)
    p = Packer()
    try:
        rtype.pack(p, (status, value))
    except XdrError as exc:
        # a result that does not encode (a bug) still gets an answer: the client must not hang
        log_failure(CODES, t.NFS3ERR_SERVERFAULT, f"NFSv3 {name} (its result)", address, exc)
        p = Packer()
        rtype.pack(p, (t.NFS3ERR_SERVERFAULT, fail))
    return p.result()


class Nfs3Program:
    versions = (t.NFS_V3,)

    def __init__(self, server):
        self.server = server

    def call(self, conn, call, cred, record, pos):
        argtype = t.ARGS3.get(call.proc)
        if argtype is None:
            raise RpcReject(accepted(call.xid, PROC_UNAVAIL))
        args = decode_args(argtype, call, record, pos)
        if call.proc == t.NFSPROC3_NULL:
            return []
        return InWorker(execute, self.server, cred, conn.peer[0], call.proc, args)
