"""The NLM lock manager: NLM requests of NFSv3 clients applied to the NFSv4 state table's
byte-range locks (one lock manager for both protocols), blocked requests and their
NLM_GRANTED callbacks, DOS share reservations, and the grace period after a restart.

An NLM owner is (caller_name, svid, oh): the caller's host is a lock client of the state
table and ``svid + oh`` its lock owner. Blocking locks: a request that conflicts gets
NLM4_BLOCKED and waits here; when the range frees (an NLM unlock at once, anything else at
the next tick) the lock is taken for the waiter and NLM_GRANTED is sent to the client's NLM
service, found through the port mapper of the client's host. When that callback cannot be
made (no route back, no rpcbind on the client) the lock stays taken for the waiter: Linux
lockd re-sends the blocked NLM_LOCK every 30 s and gets NLM4_GRANTED; a grant nobody picks
up within ``GRANT_PICKUP_SECONDS`` is released."""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from appliance.nfs import access
from appliance.nfs.nlm import types as t
from appliance.nfs.portmap import RpcCallError, getport, rpc_call
from appliance.nfs.state import INF, NfsError, is_write
from appliance.nfs.v4.const import NFS4ERR_DELAY, NFS4ERR_GRACE

log = logging.getLogger("shingle.nfs.nlm")

GRANT_PICKUP_SECONDS = 120.0
CALLBACK_TIMEOUT = 5.0
IDLE_HOST_SECONDS = 60.0  # a host without locks this long is no longer monitored
# several heads: how long a request waits for another head to publish its locks of a file
PUBLISH_TRIES, PUBLISH_WAIT_S = 6, 0.25
UNPUBLISHED = "unpublished"  # they were not published in that time


class NlmError(Exception):
    def __init__(self, status: int, message: str = ""):
        super().__init__(message or str(status))
        self.status = status


CODES = access.Codes(
    NlmError,
    badhandle=t.NLM4_STALE_FH,
    stale=t.NLM4_STALE_FH,
    access=t.NLM4_FAILED,
    rofs=t.NLM4_ROFS,
    io=t.NLM4_FAILED,
    delay=t.NLM4_DENIED_NOLOCKS,
    serverfault=t.NLM4_FAILED,
    inval=t.NLM4_FAILED,
    fbig=t.NLM4_FBIG,
    errno_map={errno.ESTALE: t.NLM4_STALE_FH, errno.ENOENT: t.NLM4_STALE_FH},
    carries_status=(NlmError,),
)


def nlm_range(offset: int, length: int) -> tuple[int, int]:
    """[start, end) of an NLM lock; length 0 reaches to the end of the file."""
    if length == 0:
        return offset, INF
    end = offset + length
    if end > INF:
        raise NlmError(t.NLM4_FBIG, f"lock range {offset}+{length} passes 2^64")
    return offset, end


def owner_of(lock) -> bytes:
    """The state table's lock owner for an NLM owner: svid then oh."""
    return (lock.svid & 0xFFFFFFFF).to_bytes(4, "big") + bytes(lock.oh)


@dataclass
class Waiter:
    """A blocked NLM_LOCK: what it asked for and, once taken for it, when."""

    address: str
    lock: Any  # nlm4_lock
    exclusive: bool
    ino: int
    start: int
    end: int
    granted_at: float = 0.0
    cookie: bytes = field(default_factory=lambda: os.urandom(8))

    @property
    def key(self) -> tuple:
        return waiter_key(self.lock, self.ino, self.start, self.end, self.exclusive)


def waiter_key(lock, ino: int, start: int, end: int, exclusive: bool) -> tuple:
    return (lock.caller_name, owner_of(lock), ino, start, end, exclusive)


@dataclass
class Share:
    host: str
    oh: bytes
    mode: int  # fsh4_mode: what others are denied
    access: int  # fsh4_access


class NlmManager:
    def __init__(self, server, monitor, *, grace_seconds: int, client_rpcbind_port: int = 111):
        self.server = server
        self.monitor = monitor
        self.client_rpcbind_port = client_rpcbind_port
        self._mutex = threading.Lock()  # waiters and shares; the state table has its own
        self.waiters: dict[tuple, Waiter] = {}
        self.shares: dict[int, list[Share]] = {}
        self.idle_since: dict[str, float] = {}
        self.grace_end = (
            time.monotonic() + grace_seconds if monitor.previous and grace_seconds > 0 else 0.0
        )
        if self.grace_end:
            log.info(
                "NLM grace period of %d s for %d previous hosts",
                grace_seconds,
                len(monitor.previous),
            )

    @property
    def state(self):
        return self.server.state

    # -- grace ------------------------------------------------------------------------------
    def in_grace(self) -> bool:
        """Only reclaims are granted while NLM or NFSv4 clients may reclaim."""
        if self.grace_end and time.monotonic() >= self.grace_end:
            self.grace_end = 0.0
            log.info("NLM grace period over")
        return bool(self.grace_end) or self.state.grace.in_grace()

    def take_over(self, hosts: dict[str, str], nsm_name: str) -> None:
        """Several heads: the NLM hosts of a dead head (caller name -> address) are this head's
        now (their locks went with it; the cluster is in grace): monitored here, and told by
        SM_NOTIFY, under the name they knew the dead head by, to reclaim."""
        self.monitor.adopt(hosts)
        self.submit(self.monitor.notify_hosts, hosts, nsm_name)

    def _check_grace(self, reclaim: bool) -> None:
        if self.in_grace() and not reclaim:
            raise NlmError(t.NLM4_DENIED_GRACE_PERIOD, "server in grace period")

    # -- handles -------------------------------------------------------------------------
    def _file(self, fh, address: str, *, write: bool = False) -> int:
        """The inode an NFSv3 handle names, through the export checks; ``write``: the export
        must be writable (an exclusive lock is a write lock)."""
        _, rule, attr = access.resolve(self.server, bytes(fh), address, CODES)
        assert rule is not None  # NFSv3 handles have no pseudo-root
        if write:
            access.need_writable(rule, CODES)
        return attr.ino

    def _host(self, lock, address: str):
        return self.state.nlm.host(lock.caller_name, address)

    # -- procedures (in worker threads) -------------------------------------------------------
    def test(self, address: str, args):
        """(status, holder or None)."""
        lock = args.alock
        ino = self._file(lock.fh, address)
        start, end = nlm_range(lock.l_offset, lock.l_len)
        self._check_grace(False)
        host = self._host(lock, address)
        hit = self._published(
            lambda: self.state.nlm.test(host, owner_of(lock), ino, start, end, args.exclusive)
        )
        if hit is None:
            return t.NLM4_GRANTED, None
        if hit is UNPUBLISHED:
            return t.NLM4_DENIED_NOLOCKS, None
        return t.NLM4_DENIED, self.holder(hit)

    @staticmethod
    def _published(attempt):
        """``attempt()`` again while another head keeps its locks of the file in memory
        (NFS4ERR_DELAY: it publishes them within a second, appliance.nfs.state.holdings);
        UNPUBLISHED when it has not by then."""
        for _ in range(PUBLISH_TRIES):
            try:
                return attempt()
            except NfsError as exc:
                if exc.status != NFS4ERR_DELAY:
                    raise
            time.sleep(PUBLISH_WAIT_S)
        return UNPUBLISHED

    @staticmethod
    def holder(hit):
        """The nlm4_holder of a conflicting NLM or NFSv4 lock."""
        lk, r0, r1, rtype = hit
        if lk.client.owner.startswith(b"nlm:") and len(lk.owner) >= 4:
            svid = int.from_bytes(lk.owner[:4], "big", signed=True)
            oh = lk.owner[4:]
        else:  # an NFSv4 lock owner
            svid, oh = 0, lk.owner[: t.MAXNETOBJ_SZ]
        return t.nlm4_holder.cls(is_write(rtype), svid, oh, r0, 0 if r1 == INF else r1 - r0)

    def lock(self, address: str, args, *, monitored: bool = True) -> int:
        lock = args.alock
        ino = self._file(lock.fh, address, write=args.exclusive)
        start, end = nlm_range(lock.l_offset, lock.l_len)
        self._check_grace(args.reclaim)
        self._recall_first(ino, args.exclusive)
        host = self._host(lock, address)
        key = waiter_key(lock, ino, start, end, args.exclusive)
        try:
            hit = self._published(
                lambda: self.state.nlm.lock(
                    host, owner_of(lock), ino, start, end, args.exclusive, args.reclaim
                )
            )
        except NfsError as exc:  # several heads: their grace period began since the check
            if exc.status != NFS4ERR_GRACE:
                raise
            raise NlmError(t.NLM4_DENIED_GRACE_PERIOD, "heads in their grace period") from exc
        if hit is None:
            with self._mutex:
                self.waiters.pop(key, None)  # a blocked request picks up its grant
            if monitored:
                self.monitor.monitor(lock.caller_name, address)
            self.idle_since.pop(lock.caller_name, None)
            return t.NLM4_GRANTED
        if not args.block:
            return t.NLM4_DENIED
        with self._mutex:
            if key not in self.waiters:
                self.waiters[key] = Waiter(address, lock, args.exclusive, ino, start, end)
        self.monitor.monitor(lock.caller_name, address)
        return t.NLM4_BLOCKED

    def _recall_first(self, ino: int, exclusive: bool) -> None:
        """An exclusive lock announces a write: an NFSv4 client's delegation of the file is
        recalled first (appliance.nfs.state.delegations), a shared one only a write
        delegation (whose holder may lock locally), the lock answered DENIED_GRACE_PERIOD
        meanwhile. Linux lockd then waits 5 s and asks again, blocking or not; a DENIED would
        fail the caller's fcntl for good, a BLOCKED would leave the grant to a callback the
        client may not be reachable for."""
        delegations = self.state.delegations
        if not delegations.held(ino, writes_only=not exclusive):
            return
        try:
            delegations.conflict(ino, None, write=exclusive)
        except NfsError as exc:
            raise NlmError(t.NLM4_DENIED_GRACE_PERIOD, str(exc)) from None

    def cancel(self, address: str, args) -> int:
        lock = args.alock
        ino = self._file(lock.fh, address)
        start, end = nlm_range(lock.l_offset, lock.l_len)
        self._check_grace(False)
        with self._mutex:
            waiter = self.waiters.pop(waiter_key(lock, ino, start, end, args.exclusive), None)
        if waiter is not None and waiter.granted_at:
            # taken for the waiter, never picked up: the client no longer wants it
            self.state.nlm.unlock(self._host(lock, address), owner_of(lock), ino, start, end)
            self.retry_waiters()
        return t.NLM4_GRANTED

    def unlock(self, address: str, args) -> int:
        lock = args.alock
        ino = self._file(lock.fh, address)
        start, end = nlm_range(lock.l_offset, lock.l_len)
        self._check_grace(False)
        self.state.nlm.unlock(self._host(lock, address), owner_of(lock), ino, start, end)
        self.retry_waiters()
        return t.NLM4_GRANTED

    def granted_reply(self, cookie: bytes, status: int) -> None:
        """NLM_GRANTED_RES from a client: a refused grant is released."""
        with self._mutex:
            waiter = next((w for w in self.waiters.values() if w.cookie == cookie), None)
            if waiter is None:
                return
            del self.waiters[waiter.key]
        if status != t.NLM4_GRANTED:
            self._release_grant(waiter)

    def share(self, address: str, args, *, unshare: bool = False) -> int:
        """NLM_SHARE and NLM_UNSHARE: DOS share reservations, which meet NFSv4 opens as another
        open would (their access and deny bits are NFSv4's). With several heads they are
        published in this head's holdings row with its opens' modes, and checked against the
        other heads' rows (their NFSv4 opens and NLM shares) in the same transaction."""
        sh = args.share
        ino = self._file(sh.fh, address)
        if not unshare:
            self._check_grace(args.reclaim)
        holdings = self.state.holdings
        with self.state.lock, self._mutex:
            mine = [
                s
                for s in self.shares.get(ino, [])
                if not (s.host == sh.caller_name and s.oh == bytes(sh.oh))
            ]
            opens = [
                st for st in self.state.shares.by_file.get(ino, ()) if st.other in self.state.states
            ]
            if unshare:
                status = t.NLM4_GRANTED
            elif any((sh.access & s.mode) or (sh.mode & s.access) for s in mine) or any(
                (sh.access & st.deny) or (sh.mode & st.access) for st in opens
            ):
                return t.NLM4_DENIED
            else:
                if holdings is not None:
                    self._grant_across_heads(holdings, ino, sh.access, sh.mode, args.reclaim)
                mine.append(Share(sh.caller_name, bytes(sh.oh), sh.mode, sh.access))
                status = t.NLM4_GRANTED
            if mine:
                self.shares[ino] = mine
            else:
                self.shares.pop(ino, None)
        if unshare and holdings is not None:
            holdings.changed(ino)
            holdings.flush_quietly()  # before the reply: another head's client retries
        if not unshare:
            self.monitor.monitor(sh.caller_name, address)
        return status

    @staticmethod
    def _grant_across_heads(holdings, ino: int, access: int, deny: int, reclaim: bool) -> None:
        try:
            granted = holdings.grant_open(None, ino, access, deny, reclaim)
        except NfsError as exc:
            if exc.status == NFS4ERR_GRACE:
                raise NlmError(t.NLM4_DENIED_GRACE_PERIOD, str(exc)) from None
            raise
        if not granted:
            raise NlmError(t.NLM4_DENIED, f"inode {ino}: a share reservation through another head")

    def shared_modes(self, ino: int) -> tuple[int, int]:
        """(access, deny) of the NLM shares of ``ino``, for this head's holdings row."""
        access = deny = 0
        for s in list(self.shares.get(ino, ())):
            access, deny = access | s.access, deny | s.mode
        return access, deny

    def host_rebooted(self, name: str) -> int:
        """FREE_ALL or SM_NOTIFY: the host lost its locks; drop what it held and waited for."""
        with self._mutex:
            for key in [k for k, w in self.waiters.items() if w.lock.caller_name == name]:
                del self.waiters[key]
            for ino in list(self.shares):
                kept = [s for s in self.shares[ino] if s.host != name]
                if len(kept) < len(self.shares[ino]) and self.state.holdings is not None:
                    self.state.holdings.changed(ino)
                if kept:
                    self.shares[ino] = kept
                else:
                    del self.shares[ino]
        freed = self.state.nlm.free_host(name)
        self.monitor.unmonitor(name)
        self.retry_waiters()
        return freed

    # -- blocked locks ---------------------------------------------------------------------
    def has_waiters(self) -> bool:
        return bool(self.waiters)

    def retry_waiters(self) -> None:
        """Take what freed for blocked requests (oldest first) and call them back."""
        now = time.monotonic()
        granted = []
        with self._mutex:
            waiting = list(self.waiters.values())
        for w in waiting:
            if w.granted_at:
                if now - w.granted_at > GRANT_PICKUP_SECONDS:
                    log.info("grant of %s to %s not picked up: released", w.key[2:], w.address)
                    with self._mutex:
                        self.waiters.pop(w.key, None)
                    self._release_grant(w)
                continue
            host = self._host(w.lock, w.address)
            try:
                hit = self.state.nlm.lock(
                    host, owner_of(w.lock), w.ino, w.start, w.end, w.exclusive
                )
            except NfsError as exc:  # several heads: in grace, or the other head's locks
                if exc.status == NFS4ERR_GRACE:  # are not published yet: the next tick
                    break
                if exc.status != NFS4ERR_DELAY:
                    raise
                continue
            if hit is None:
                w.granted_at = now
                granted.append(w)
        for w in granted:
            self.submit(self._call_granted, w)

    def _release_grant(self, w: Waiter) -> None:
        self.state.nlm.unlock(
            self._host(w.lock, w.address), owner_of(w.lock), w.ino, w.start, w.end
        )

    def submit(self, fn, *args) -> None:
        pool = self.server.pool
        try:
            pool.submit(fn, *args)
        except RuntimeError:  # the server is stopping
            pass

    def _call_granted(self, w: Waiter) -> None:
        if self.server.callback_reaches_self(w.address):
            return  # the client's retry picks the grant up
        args = t.nlm4_testargs.encode((w.cookie, w.exclusive, w.lock))
        try:
            port = getport(
                w.address,
                t.NLM_PROGRAM,
                t.NLM_V4,
                pmap_port=self.client_rpcbind_port,
                timeout=CALLBACK_TIMEOUT,
            )
            body = rpc_call(
                w.address,
                port,
                t.NLM_PROGRAM,
                t.NLM_V4,
                t.NLMPROC4_GRANTED,
                args,
                timeout=CALLBACK_TIMEOUT,
            )
            res = t.nlm4_res.decode(body)
        except (RpcCallError, ValueError) as exc:
            # the client polls: its next blocked NLM_LOCK picks the grant up
            log.debug("NLM_GRANTED to %s failed (%s): waiting for its retry", w.address, exc)
            return
        self.granted_reply(w.cookie, res.stat)

    def notify_to_res(self, address: str, proc: int, body: bytes) -> None:
        """The answer to an asynchronous _MSG request, sent back as its _RES procedure."""
        if self.server.callback_reaches_self(address):
            log.info(
                "NLM reply %s to %s not sent: it would reach this server",
                t.NLM_PROC_NAMES.get(proc),
                address,
            )
            return
        try:
            port = getport(
                address,
                t.NLM_PROGRAM,
                t.NLM_V4,
                pmap_port=self.client_rpcbind_port,
                timeout=CALLBACK_TIMEOUT,
            )
            rpc_call(address, port, t.NLM_PROGRAM, t.NLM_V4, proc, body, timeout=CALLBACK_TIMEOUT)
        except RpcCallError as exc:
            log.info("NLM reply %s to %s failed: %s", t.NLM_PROC_NAMES.get(proc), address, exc)

    # -- housekeeping -----------------------------------------------------------------------
    def tick(self) -> None:
        """Periodically: grants for waiters whose conflict went away (an NFSv4 unlock, an
        expired lease), and hosts without locks dropped from the monitor list."""
        if self.waiters:
            self.retry_waiters()
        self.in_grace()
        now = time.monotonic()
        holding = self._hosts_holding()
        for name in list(self.monitor.hosts):
            if name in holding:
                self.idle_since.pop(name, None)
            elif self.grace_end:
                continue  # a previous host may still come back to reclaim
            elif now - self.idle_since.setdefault(name, now) > IDLE_HOST_SECONDS:
                self.idle_since.pop(name, None)
                self.monitor.unmonitor(name)

    def _hosts_holding(self) -> set[str]:
        with self.state.lock:
            held = {name for name, host in self.state.nlm.hosts.items() if host.states}
        with self._mutex:
            held |= {w.lock.caller_name for w in self.waiters.values()}
            held |= {s.host for shares in self.shares.values() for s in shares}
        return held
