"""Program 100021 version 4 (NLM v4): decodes a call, applies it through the lock manager
(appliance.nfs.nlm.manager) in a worker thread and encodes the result; a failure becomes
the procedure's nlm4_stats. The asynchronous _MSG requests are answered with void at once
and their result is sent back to the client's NLM service as the matching _RES call."""

from __future__ import annotations

import logging

from appliance.nfs.access import status_of
from appliance.nfs.nlm import types as t
from appliance.nfs.nlm.manager import CODES
from appliance.nfs.onc.rpc import PROC_UNAVAIL, InWorker, RpcReject, accepted, decode_args
from appliance.nfs.onc.xdr import Packer

log = logging.getLogger("shingle.nfs.nlm")


class NlmProgram:
    versions = (t.NLM_V4,)

    def __init__(self, server):
        self.server = server

    def call(self, conn, call, cred, record, pos):
        argtype = t.NLM_ARGS.get(call.proc)
        if argtype is None:
            raise RpcReject(accepted(call.xid, PROC_UNAVAIL))
        args = decode_args(argtype, call, record, pos)
        proc = call.proc
        if proc == t.NLMPROC4_NULL:
            return []
        return InWorker(self._answer, proc, args, conn.peer[0])

    def _answer(self, proc: int, args, address: str) -> list:
        nlm = self.server.nlm
        self.server.counters.op(f"nlm_{t.NLM_PROC_NAMES.get(proc, proc)}")
        if proc in t.MSG_TO_SYNC:
            if proc == t.NLMPROC4_GRANTED_MSG:
                return []  # this server takes no locks from clients: nothing was blocked
            body = self.execute(t.MSG_TO_SYNC[proc], args, address)
            nlm.submit(nlm.notify_to_res, address, t.MSG_TO_RES[proc], body)
            return []
        if proc == t.NLMPROC4_GRANTED_RES:
            nlm.granted_reply(bytes(args.cookie), args.stat)
            return []
        if proc in t.MSG_TO_RES.values():
            return []  # answers to calls this server never makes
        if proc == t.NLMPROC4_FREE_ALL:
            freed = nlm.host_rebooted(args.name)
            log.info("NLM FREE_ALL from %s for %s: %d lock owners freed", address, args.name, freed)
            return []
        return [self.execute(proc, args, address)]

    def execute(self, proc: int, args, address: str) -> bytes:
        """The encoded result of a synchronous procedure."""
        nlm = self.server.nlm
        holder = None
        try:
            if proc == t.NLMPROC4_TEST:
                status, holder = nlm.test(address, args)
            elif proc == t.NLMPROC4_LOCK:
                status = nlm.lock(address, args)
            elif proc == t.NLMPROC4_NM_LOCK:
                args.block = False  # non-monitored: never blocks (XNFS 10.14)
                status = nlm.lock(address, args, monitored=False)
            elif proc == t.NLMPROC4_CANCEL:
                status = nlm.cancel(address, args)
            elif proc == t.NLMPROC4_UNLOCK:
                status = nlm.unlock(address, args)
            elif proc in (t.NLMPROC4_SHARE, t.NLMPROC4_UNSHARE):
                status = nlm.share(address, args, unshare=proc == t.NLMPROC4_UNSHARE)
            else:  # GRANTED: this server is never a client waiting for a lock
                status = t.NLM4_DENIED
        except Exception as exc:  # noqa: BLE001 - a failure is a status, not a dead connection
            status = status_of(exc, CODES)
            if status == t.NLM4_FAILED:
                log.exception("NLM %s failed", t.NLM_PROC_NAMES.get(proc, proc))
            else:
                log.debug("NLM %s: status %d: %s", t.NLM_PROC_NAMES.get(proc, proc), status, exc)
        cookie = bytes(args.cookie)
        if proc == t.NLMPROC4_TEST:
            value = t.nlm4_testres.cls(cookie, (status, holder))
        elif proc in (t.NLMPROC4_SHARE, t.NLMPROC4_UNSHARE):
            value = t.nlm4_shareres.cls(cookie, status, 0)
        else:
            value = t.nlm4_res.cls(cookie, status)
        p = Packer()
        t.NLM_RESULTS[proc].pack(p, value)
        return p.getvalue()
