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

# A bigger COMPOUND (a WRITE of more than this) is tried on the event loop only while no call
# waits for or runs in a worker: an UNSTABLE WRITE then skips a thread hand-off (one writer
# streaming); with several writers at once, the workers copy their data into the file buffers
# while the loop reads the next records from the sockets. Up to 64 KiB the copy costs the loop
# less than the hand-off (nfs-rs sends each MiB as WRITEs of 1,044,480 and 4,096 bytes: with 8
# writers, 2.85 -> 2.0 worker calls per MiB).
FROM_CACHE_MAX_BYTES = 64 * 1024


class Nfs4Program:
    versions = (c.NFS_V4,)

    def __init__(self, server):
        self.server = server

    def call(self, conn, call, cred, record, pos):
        if call.proc == 0:
            return []
        if call.proc != 1:
            raise RpcReject(accepted(call.xid, PROC_UNAVAIL))
        if len(record) - pos > FROM_CACHE_MAX_BYTES and not self.server.pool.idle():
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
