"""NSM, the network status monitor (program 100024), as the NLM server side needs it.

``NsmMonitor`` keeps the hosts that hold NLM locks in the catalog (settings row
``nsm_monitored``; for head i of several ``nsm_monitored_head<i>``, that head's own hosts,
whose connections all reach it: docs/heads.md) and this server's NSM state number
(``nsm_state``: odd while up, raised at every start). After a restart it sends SM_NOTIFY to
every host recorded by the previous instance, through that host's port mapper, so that their
lock managers reclaim during the grace period. ``NsmProgram`` answers SM_STAT/SM_MON/SM_UNMON
and takes SM_NOTIFY from a rebooted client: that host's locks are freed."""

from __future__ import annotations

import json
import logging
import threading
import time

from appliance.nfs.nlm import types as t
from appliance.nfs.onc.rpc import PROC_UNAVAIL, InWorker, RpcReject, accepted, decode_args
from appliance.nfs.onc.xdr import Packer
from appliance.nfs.portmap import RpcCallError, getport, rpc_call

log = logging.getLogger("shingle.nfs.nsm")

STATE_KEY = "nsm_state"
MONITORED_KEY = "nsm_monitored"
NOTIFY_ATTEMPTS = 3
NOTIFY_TIMEOUT = 5.0


class NsmMonitor:
    """Monitored hosts (caller name -> address) and this server's NSM state, persisted."""

    def __init__(
        self,
        catalog,
        *,
        my_name: str,
        client_rpcbind_port: int = 111,
        unreachable=lambda address: False,
        head: int | None = None,
    ):
        """``head``: this head's index among several over one catalog (its own list of hosts;
        head 0 also takes over the list a single head kept), None for a head alone."""
        self.catalog = catalog
        self.key = MONITORED_KEY if head is None else f"{MONITORED_KEY}_head{head}"
        self.keys = [self.key] + ([MONITORED_KEY] if head == 0 else [])
        self.unreachable = unreachable  # address -> True when a callback cannot reach it
        self.my_name = my_name
        self.client_rpcbind_port = client_rpcbind_port
        self.lock = threading.Lock()
        previous = catalog.get_setting(STATE_KEY)
        state = int(previous) if previous and previous.lstrip("-").isdigit() else 0
        self.state = state + 2 if state % 2 else state + 1  # odd: up
        catalog.set_setting(STATE_KEY, str(self.state))
        self.previous: dict[str, str] = self._load()
        self.hosts: dict[str, str] = dict(self.previous)
        self.notified: dict[str, bool] = {}

    def _load(self) -> dict[str, str]:
        hosts: dict[str, str] = {}
        for key in reversed(self.keys):  # this head's own list wins
            raw = self.catalog.get_setting(key)
            try:
                hosts.update({str(k): str(v) for k, v in json.loads(raw).items()} if raw else {})
            except (ValueError, AttributeError) as exc:
                log.warning("monitored hosts record %s unreadable (%s): left out", key, exc)
        return hosts

    def _save(self) -> None:
        self.catalog.set_setting(self.key, json.dumps(self.hosts, sort_keys=True))

    def monitor(self, name: str, address: str) -> None:
        """Remember ``name`` (reached at ``address``) until it holds no locks."""
        with self.lock:
            if self.hosts.get(name) == address:
                return
            self.hosts[name] = address
            self._save()

    def unmonitor(self, name: str) -> None:
        with self.lock:
            if self.hosts.pop(name, None) is not None:
                self._save()

    def adopt(self, hosts: dict[str, str]) -> None:
        """Several heads: a dead head's hosts are monitored here too (the catalog row was
        merged by the head that took them, appliance.nfs.state.heads)."""
        with self.lock:
            for name, address in hosts.items():
                self.hosts.setdefault(name, address)

    def notify_previous(self) -> int:
        """SM_NOTIFY to every host the previous instance monitored (in a worker); how many
        were reached. A host not reached keeps its record and learns of the restart from its
        own retries (Linux lockd retries a lock refused with DENIED_GRACE_PERIOD)."""
        return self.notify_hosts(self.previous)

    def notify_hosts(self, hosts: dict[str, str], mon_name: str = "") -> int:
        """SM_NOTIFY to ``hosts`` (caller name -> address) as ``mon_name`` (default: this
        server's name); how many were reached."""
        reached = 0
        for name, address in sorted(hosts.items()):
            if self.unreachable(address):
                log.info(
                    "SM_NOTIFY to %s (%s) skipped: it would reach this server's own port mapper",
                    name,
                    address,
                )
                continue
            for attempt in range(NOTIFY_ATTEMPTS):
                try:
                    self.notify(name, address, mon_name)
                    reached += 1
                    break
                except RpcCallError as exc:
                    log.info(
                        "SM_NOTIFY to %s (%s) attempt %d failed: %s",
                        name,
                        address,
                        attempt + 1,
                        exc,
                    )
                    time.sleep(1.0)
        return reached

    def notify(self, name: str, address: str, mon_name: str = "") -> None:
        port = getport(
            address,
            t.NSM_PROGRAM,
            t.NSM_V1,
            pmap_port=self.client_rpcbind_port,
            timeout=NOTIFY_TIMEOUT,
        )
        rpc_call(
            address,
            port,
            t.NSM_PROGRAM,
            t.NSM_V1,
            t.SM_NOTIFY,
            t.stat_chge.encode((mon_name or self.my_name, self.state)),
            timeout=NOTIFY_TIMEOUT,
        )
        self.notified[name] = True
        log.info("SM_NOTIFY sent to %s (%s): state %d", name, address, self.state)


class NsmProgram:
    """Program 100024 version 1."""

    versions = (t.NSM_V1,)

    def __init__(self, server):
        self.server = server

    def call(self, conn, call, cred, record, pos):
        argtype = t.NSM_ARGS.get(call.proc)
        if argtype is None:
            raise RpcReject(accepted(call.xid, PROC_UNAVAIL))
        args = decode_args(argtype, call, record, pos)
        proc = call.proc
        if proc in (t.SM_NULL, t.SM_SIMU_CRASH):
            return []
        return InWorker(self._answer, proc, args, conn.peer[0])

    def _answer(self, proc: int, args, address: str) -> list:
        nlm = self.server.nlm
        state = nlm.monitor.state
        if proc == t.SM_NOTIFY:
            self.server.counters.op("nsm_notify")
            freed = nlm.host_rebooted(args.mon_name)
            log.info(
                "SM_NOTIFY from %s (%s), state %d: %d lock owners freed",
                args.mon_name,
                address,
                args.state,
                freed,
            )
            value = None
        elif proc == t.SM_STAT:
            value = t.sm_stat_res.cls(t.STAT_SUCC, state)
        elif proc == t.SM_MON:
            # another lock manager asks us to watch a host: this server only watches its own
            # NLM clients, but the answer is the one rpc.statd gives
            nlm.monitor.monitor(args.mon_id.mon_name, address)
            value = t.sm_stat_res.cls(t.STAT_SUCC, state)
        elif proc == t.SM_UNMON:
            nlm.monitor.unmonitor(args.mon_name)
            value = t.sm_stat.cls(state)
        else:  # SM_UNMON_ALL
            value = t.sm_stat.cls(state)
        p = Packer()
        t.NSM_RESULTS[proc].pack(p, value)
        return p.result()
