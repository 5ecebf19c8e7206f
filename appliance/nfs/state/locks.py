"""Byte-range locks of NFSv4 lock-owners and NLM owners alike (POSIX semantics, which
RFC 7530's LOCK follows): each lock state holds its owner's ranges of one file, merged and
split as the owner locks and unlocks; ``conflict`` is the one check every LOCK, LOCKT and
NLM request goes through, so NFSv3 and NFSv4 locks on a file meet."""

from __future__ import annotations

from typing import TYPE_CHECKING

from appliance.nfs.state.core import StateCore
from appliance.nfs.state.leases import Leases
from appliance.nfs.state.model import Client, LockState, NfsError, OpenState
from appliance.nfs.v4 import const as c
from appliance.nfs.v4.types import LOCK4denied, state_owner4

if TYPE_CHECKING:
    from appliance.nfs.state.holdings import Holdings

INF = 1 << 64  # end of a lock "to end of file"


def overlaps(a0, a1, b0, b1) -> bool:
    return a0 < b1 and b0 < a1


def lock_range(offset: int, length: int) -> tuple[int, int]:
    if length == 0:
        raise NfsError(c.NFS4ERR_INVAL, "lock length 0")
    if length == c.NFS4_UINT64_MAX:
        return offset, INF
    end = offset + length
    if end > INF:
        raise NfsError(c.NFS4ERR_INVAL, f"lock range {offset}+{length} passes 2^64")
    return offset, end


def is_write(locktype: int) -> bool:
    return locktype in (c.WRITE_LT, c.WRITEW_LT)


class Locks:
    def __init__(self, core: StateCore, leases: Leases):
        self.core, self.leases = core, leases
        self.by_file: dict[int, list[LockState]] = {}
        self.by_owner_file: dict[tuple, LockState] = {}  # (client id, owner, inode)
        # several heads over one catalog: the other heads' locks (appliance.nfs.state.holdings)
        self.holdings: Holdings | None = None

    def conflict(self, cl: Client, owner: bytes, ino: int, start: int, end: int, locktype: int):
        """The first lock of another owner that [start, end) of ``locktype`` conflicts with,
        as (lock state, start, end, type), or None; a conflicting lock of an expired client
        goes with its client."""
        states = self.core.states
        for lk in list(self.by_file.get(ino, ())):
            if (lk.client is cl and lk.owner == owner) or lk.other not in states:
                continue
            for r0, r1, rtype in lk.ranges:
                if overlaps(start, end, r0, r1) and (is_write(locktype) or is_write(rtype)):
                    if self.leases.evict_if_expired(lk.client):
                        break  # its locks went with it
                    return lk, r0, r1, rtype
        return None

    def conflict_anywhere(
        self, cl: Client, owner: bytes, ino: int, start: int, end: int, locktype: int
    ):
        """``conflict``, then the other heads' locks (LOCKT, NLM_TEST)."""
        hit = self.conflict(cl, owner, ino, start, end, locktype)
        if hit is None and self.holdings is not None:
            hit = self.holdings.test_lock(ino, start, end, locktype)
        return hit

    @staticmethod
    def denied(hit):
        lk, r0, r1, rtype = hit
        length = c.NFS4_UINT64_MAX if r1 == INF else r1 - r0
        return LOCK4denied.cls(
            r0,
            length,
            c.WRITE_LT if is_write(rtype) else c.READ_LT,
            state_owner4.cls(lk.client.clientid, lk.owner),
        )

    def state_for(self, cl: Client, open_st: OpenState, owner: bytes) -> LockState:
        """The lock state of ``owner`` on ``open_st``'s file, made on its first LOCK."""
        key = (cl.clientid, owner, open_st.ino)
        lk = self.by_owner_file.get(key)
        if lk is None:
            lk = self.add_state(cl, open_st, owner, open_st.ino)
            open_st.locks.add(lk.other)
        return lk

    def add_state(self, cl: Client, open_st: OpenState, owner: bytes, ino: int) -> LockState:
        core = self.core
        lk = LockState(core.new_other(cl), cl, ino, owner, open_st, seqid=0)
        core.states[lk.other] = lk
        self.by_owner_file[(cl.clientid, owner, ino)] = lk
        self.by_file.setdefault(ino, []).append(lk)
        cl.states.add(lk.other)
        return lk

    def add(
        self, lk: LockState, start: int, end: int, locktype: int, reclaim: bool = False
    ) -> None:
        hit = self.try_add(lk, start, end, locktype, reclaim)
        if hit is not None:
            raise NfsError(c.NFS4ERR_DENIED, "lock conflict", self.denied(hit))

    def try_add(self, lk: LockState, start: int, end: int, locktype: int, reclaim: bool = False):
        """Give ``lk`` [start, end) of ``locktype``; the conflicting lock (nothing given) or
        None. With several heads, theirs are checked too and this head's are published
        (NFS4ERR_GRACE while the cluster is in grace, unless ``reclaim``)."""
        hit = self.conflict(lk.client, lk.owner, lk.ino, start, end, locktype)
        if hit is not None:
            return hit
        kind = c.WRITE_LT if is_write(locktype) else c.READ_LT
        ranges = _merged(_cut(lk.ranges, start, end) + [(start, end, kind)])
        if self.holdings is not None:
            hit = self.holdings.grant_lock(lk, start, end, locktype, ranges, reclaim)
            if hit is not None:
                return hit
        lk.ranges = ranges
        lk.seqid += 1
        return None

    def unlock(self, lk: LockState, start: int, end: int) -> None:
        lk.ranges = _cut(lk.ranges, start, end)
        lk.seqid += 1
        if self.holdings is not None:
            self.holdings.changed(lk.ino)

    def drop(self, lk: LockState) -> None:
        if self.core.states.pop(lk.other, None) is None:
            return
        locks = self.by_file.get(lk.ino, [])
        if lk in locks:
            locks.remove(lk)
        if not locks:
            self.by_file.pop(lk.ino, None)
        self.by_owner_file.pop((lk.client.clientid, lk.owner, lk.ino), None)
        lk.open.locks.discard(lk.other)
        lk.client.states.discard(lk.other)
        if self.holdings is not None and lk.ranges:
            self.holdings.changed(lk.ino)


def _cut(ranges: list, start: int, end: int) -> list:
    """``ranges`` minus [start, end): POSIX locks of one owner split and merge."""
    out = []
    for r0, r1, t in ranges:
        if not overlaps(start, end, r0, r1):
            out.append((r0, r1, t))
            continue
        if r0 < start:
            out.append((r0, start, t))
        if end < r1:
            out.append((end, r1, t))
    return out


def _merged(ranges: list) -> list:
    """``ranges`` (not overlapping) sorted, with touching ranges of one type joined: a lock-owner
    holds one lock where its locks meet (POSIX semantics, which RFC 7530's LOCK follows), and
    LOCKT, a DENIED LOCK or a later LOCKU sees that one range."""
    out: list = []
    for r0, r1, t in sorted(ranges):
        if out and out[-1][1] == r0 and out[-1][2] == t:
            out[-1] = (out[-1][0], r1, t)
        else:
            out.append((r0, r1, t))
    return out
