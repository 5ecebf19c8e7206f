"""NLM locks (NFSv3 clients, appliance.nfs.nlm) in the same table as NFSv4's. An NLM host (its
caller_name) is a client of its own, kept out of ``clients``: it has no lease and no v4
operation reaches it. Each NLM owner (svid + oh) is one of its lock owners, so NLM and NFSv4
locks on a file meet in the same ``Locks.conflict`` check."""

from __future__ import annotations

from appliance.nfs.state.core import StateCore
from appliance.nfs.state.locks import Locks
from appliance.nfs.state.model import Client, LockState, OpenState
from appliance.nfs.v4 import const as c


class NlmLocks:
    def __init__(self, core: StateCore, locks: Locks):
        self.core, self.locks = core, locks
        self.hosts: dict[str, Client] = {}  # by caller_name

    def host(self, name: str, address: str) -> Client:
        core = self.core
        with core.lock:
            host = self.hosts.get(name)
            if host is None:
                host = Client(
                    core.new_clientid(),
                    b"nlm:" + name.encode("utf-8", "replace"),
                    b"",
                    (),
                    address,
                    confirmed=True,
                    leased=False,
                )
                self.hosts[name] = host
            host.address = address
            return host

    def test(self, host: Client, owner: bytes, ino: int, start: int, end: int, exclusive: bool):
        """The conflicting lock (as ``Locks.conflict`` returns it) or None."""
        with self.core.lock:
            return self.locks.conflict_anywhere(
                host, owner, ino, start, end, c.WRITE_LT if exclusive else c.READ_LT
            )

    def lock(
        self,
        host: Client,
        owner: bytes,
        ino: int,
        start: int,
        end: int,
        exclusive: bool,
        reclaim: bool = False,
    ):
        """Take the range for ``owner``; the conflicting lock (nothing taken) or None.
        NfsError NFS4ERR_GRACE (nothing taken) when several heads are in their grace period
        and this is no reclaim."""
        locktype = c.WRITE_LT if exclusive else c.READ_LT
        locks = self.locks
        with self.core.lock:
            hit = locks.conflict(host, owner, ino, start, end, locktype)
            if hit is not None:
                return hit
            lk = locks.by_owner_file.get((host.clientid, owner, ino))
            if lk is None:
                # an open of its own, registered nowhere: NLM has no opens (no share checks)
                pseudo_open = OpenState(b"", host, ino, b"nlm", access=c.OPEN4_SHARE_ACCESS_BOTH)
                lk = locks.add_state(host, pseudo_open, owner, ino)
            try:  # another head's lock, with several
                hit = locks.try_add(lk, start, end, locktype, reclaim)
            finally:
                if not lk.ranges:
                    locks.drop(lk)
            return hit

    def unlock(self, host: Client, owner: bytes, ino: int, start: int, end: int) -> None:
        with self.core.lock:
            lk = self.locks.by_owner_file.get((host.clientid, owner, ino))
            if lk is None:
                return
            self.locks.unlock(lk, start, end)
            if not lk.ranges:
                self.locks.drop(lk)
            holdings = self.locks.holdings
            if holdings is not None and holdings.dirty:  # written before the reply
                holdings.flush_quietly()

    def free_host(self, name: str) -> int:
        """Drop every lock of the NLM host ``name`` (it rebooted); how many lock owners held
        some."""
        with self.core.lock:
            host = self.hosts.pop(name, None)
            if host is None:
                return 0
            dropped = 0
            for other in list(host.states):
                lk = self.core.states.get(other)
                if isinstance(lk, LockState):  # an NLM host holds lock stateids only
                    self.locks.drop(lk)
                    dropped += 1
            return dropped
