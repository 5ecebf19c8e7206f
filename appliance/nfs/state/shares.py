"""Opens and their share reservations (RFC 8881 9.7, RFC 7530 9.9): one open state per
(client, open-owner, file), its access and deny modes the union of the OPENs merged into it.
An OPEN whose access meets another open's deny (or whose deny meets its access) is refused,
unless that open's client has expired (it goes, appliance.nfs.state.leases). Each open holds
an open reference on its inode, so an unlinked file lives until its last CLOSE."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from appliance.nfs.state.core import StateCore
from appliance.nfs.state.leases import Leases
from appliance.nfs.state.locks import Locks
from appliance.nfs.state.model import Client, LockState, NfsError, OpenState
from appliance.nfs.state.records import ClientRecords
from appliance.nfs.v4 import const as c
from engine.base.blocking import may_block

if TYPE_CHECKING:
    from appliance.nfs.state.holdings import Holdings

log = logging.getLogger("shingle.nfs.state")


class Shares:
    def __init__(self, core: StateCore, leases: Leases, locks: Locks, records: ClientRecords):
        self.core, self.leases, self.locks, self.records = core, leases, locks, records
        self.by_file: dict[int, list[OpenState]] = {}
        self.by_owner_file: dict[tuple, OpenState] = {}  # (client id, open-owner, inode)
        # several heads over one catalog: the other heads' opens (appliance.nfs.state.holdings)
        self.holdings: Holdings | None = None
        # (access, deny) of the NLM DOS shares (NLM_SHARE) of a file: they deny opens too
        self.nlm_modes: Callable[[int], tuple[int, int]] | None = None

    def open(
        self, cl: Client, owner: bytes, ino: int, access: int, deny: int, reclaim: bool = False
    ) -> OpenState:
        core = self.core
        with core.lock:
            key = (cl.clientid, owner, ino)
            # the open-owner's own earlier OPENs count too: an upgrade to what it denies itself
            # is refused, as knfsd and NFS-Ganesha do
            for other in list(self.by_file.get(ino, ())):
                if ((access & other.deny) or (deny & other.access)) and (
                    other.other in core.states and not self.leases.evict_if_expired(other.client)
                ):
                    raise NfsError(
                        c.NFS4ERR_SHARE_DENIED,
                        f"share reservation conflict on inode {ino}: access {access} deny "
                        f"{deny} against an open of access {other.access} deny {other.deny}",
                    )
            if self.nlm_modes is not None:
                nlm_access, nlm_deny = self.nlm_modes(ino)
                if (access & nlm_deny) or (deny & nlm_access):
                    raise NfsError(
                        c.NFS4ERR_SHARE_DENIED,
                        f"share reservation conflict on inode {ino} with an NLM share",
                    )
            st = self.by_owner_file.get(key)
            if self.holdings is not None and not self.holdings.grant_open(
                st, ino, access, deny, reclaim
            ):
                raise NfsError(
                    c.NFS4ERR_SHARE_DENIED,
                    f"share reservation conflict on inode {ino} with an open through another head",
                )
            if st is None:
                self.records.record_held_state(cl)
                st = OpenState(
                    core.new_other(cl), cl, ino, owner, seqid=1, access=access, deny=deny
                )
                core.states[st.other] = st
                self.by_file.setdefault(ino, []).append(st)
                self.by_owner_file[key] = st
                cl.states.add(st.other)
                core.namespace.open_ref(ino)
            else:
                st.access |= access
                st.deny |= deny
                st.seqid += 1
            st.modes.add((access, deny))
            return st

    def downgrade(self, st: OpenState, access: int, deny: int) -> None:
        """OPEN_DOWNGRADE to (``access``, ``deny``): the union of some of the OPENs merged into
        ``st`` (those within the new modes; RFC 7530 16.19.4), which are all it keeps."""
        with self.core.lock:
            kept = {(a, d) for a, d in st.modes if not a & ~access and not d & ~deny}
            union_access = union_deny = 0
            for a, d in kept:
                union_access, union_deny = union_access | a, union_deny | d
            if not access or (union_access, union_deny) != (access, deny):
                opened = ", ".join(f"{a}/{d}" for a, d in sorted(st.modes))
                raise NfsError(
                    c.NFS4ERR_INVAL,
                    f"downgrade to access {access} deny {deny}: no set of the OPENs "
                    f"(access/deny {opened}) makes it",
                )
            st.access, st.deny, st.modes = access, deny, kept
            st.seqid += 1
            if self.holdings is not None:
                self.holdings.changed(st.ino)

    def special_io_denied(self, ino: int, want: int, bypass: bool) -> bool:
        """Whether READ (``want`` OPEN4_SHARE_ACCESS_READ) or WRITE with a special stateid
        meets an OPEN of ``ino`` that denies it (NFS4ERR_LOCKED, RFC 7530 9.1.4.3 and 9.9); the
        READ bypass stateid passes deny modes (RFC 7530 9.1.4.3)."""
        if bypass and want == c.OPEN4_SHARE_ACCESS_READ:
            return False
        for st in list(self.by_file.get(ino, ())):
            if not st.deny & want or st.other not in self.core.states:
                continue
            if self.leases.lease_over(st.client):
                may_block("expiring the client of a conflicting open")
                self.leases.evict_if_expired(st.client)
                continue
            return True
        return self.holdings is not None and self.holdings.special_io_denied(ino, want)

    def close(self, st: OpenState) -> None:
        with self.core.lock:
            st.seqid += 1
            self.drop(st)

    def drop(self, st: OpenState) -> None:
        """The open goes with its locks, and its open reference on the inode."""
        core = self.core
        if core.states.pop(st.other, None) is None:
            return
        for other in list(st.locks):
            lk = core.states.get(other)
            if isinstance(lk, LockState):  # what an open's locks name is a lock stateid
                self.locks.drop(lk)
        opens = self.by_file.get(st.ino, [])
        if st in opens:
            opens.remove(st)
        if not opens:
            self.by_file.pop(st.ino, None)
        self.by_owner_file.pop((st.client.clientid, st.owner, st.ino), None)
        st.client.states.discard(st.other)
        if self.holdings is not None:
            self.holdings.changed(st.ino)
        try:
            core.namespace.close_ref(st.ino)
        except Exception:  # noqa: BLE001 - freeing an unlinked file can fail later; never lose the state table
            log.exception("close_ref of inode %d failed", st.ino)
