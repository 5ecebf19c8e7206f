"""Program 100003 version 4: NULL and COMPOUND, minor versions 1 and 0. Small NFSv4.1
COMPOUNDs are first tried on the event loop from the caches (appliance.nfs.v4.compound); the
rest, and every NFSv4.0 COMPOUND (appliance.nfs.v4.compound40), run in a worker."""

from __future__ import annotations

from appliance.nfs.onc.rpc import PROC_UNAVAIL, InWorker, RpcReject, accepted
from appliance.nfs.v4 import (
    compound,
    compound40,  # noqa: F401 - registers the NFSv4.0 executor
    ops,  # noqa: F401 - the operations register on import
)
from appliance.nfs.v4 import const as c

# COMPOUNDs the event loop tries from the caches first (compound.FROM_CACHE_OPS) are this small:
# a bigger one is a WRITE or a SETATTR-laden OPEN, which would only pay for the attempt
FROM_CACHE_MAX_BYTES = 2048


class Nfs4Program:
    versions = (c.NFS_V4,)

    def __init__(self, server):
        self.server = server

    def call(self, conn, call, cred, record, pos):
        if call.proc == 0:
            return []
        if call.proc != 1:
            raise RpcReject(accepted(call.xid, PROC_UNAVAIL))
        if len(record) - pos > FROM_CACHE_MAX_BYTES:
            return InWorker(
                compound.execute, self.server, conn.state, cred, conn.peer[0], record, pos
            )
        outcome = compound.execute(
            self.server, conn.state, cred, conn.peer[0], record, pos, from_cache=True
        )
        answered = not isinstance(outcome, compound.Handoff)
        if answered or not callable(outcome.run):  # an NFSv4.0 COMPOUND was never attempted
            self.server.counters.attempt(answered)
        return outcome if answered else InWorker(compound.resume, outcome, record)
