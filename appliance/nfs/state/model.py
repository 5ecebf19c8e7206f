"""What the state table holds: clients, their sessions and slots, open and lock states, and
the error an operation on them fails with."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


class NfsError(Exception):
    """An operation failed with ``status``; ``payload`` is the error arm (LOCK4denied)."""

    def __init__(self, status: int, message: str = "", payload=None):
        super().__init__(message or f"status {status}")
        self.status = status
        self.payload = payload


@dataclass
class Slot:
    seqid: int | None = 0  # None: restored after a restart, the next seqid is accepted
    reply: list | None = None  # the cached reply, one chunk (None: not cached)
    fingerprint: tuple | None = None
    busy: bool = False
    # the request the slot ran changed nothing: a retry of it runs again (RFC 8881 2.10.6.1.3)
    rerun: bool = False
    size: int = 0  # bytes of ``reply``, counted in the server's budget (replies.SlotReplies)
    gone: bool = False  # its session was dropped: it keeps no reply any more


@dataclass
class Session:
    id: bytes
    client: Client
    slots: list
    fore: Any  # channel_attrs4
    back: Any
    max_ops: int
    max_cached: int
    max_request: int
    max_response: int
    reserved: int = 0  # bytes of the slot budget it holds (replies.SlotReplies.grant)
    backchannel: Any = None  # appliance.nfs.v4.backchannel.Backchannel, when the client asked
    # (cb_program, callback_sec_parms4 list) of CREATE_SESSION: saved with the session, so that
    # a session restored after a restart gets its backchannel back once the client binds one
    callback: Any = None


@dataclass
class Client:
    clientid: int
    owner: bytes
    verifier: bytes
    principal: tuple
    address: str
    confirmed: bool = False
    cs_sequence: int = 1  # next expected CREATE_SESSION sequence
    cs_reply: object = None
    sessions: dict = field(default_factory=dict)
    last_renew: float = field(default_factory=time.monotonic)
    may_reclaim: bool = False
    reclaim_complete: bool = False
    # a session restored after a restart: its opens and locks died with the previous
    # instance; SEQUENCE asks the client to reclaim them until its next RECLAIM_COMPLETE
    reclaim_needed: bool = False
    states: set = field(default_factory=set)  # stateid "other" values
    minor: int = 1
    # NFSv4.0 only: SETCLIENTID's confirm verifier, callback and callback_ident, the callback
    # path made from them once confirmed (appliance.nfs.v4.callback40.Callback40: delegations
    # go only to a client whose path answered CB_NULL), and the open/lock-owners by
    # (kind, owner) (state.v40.Owner)
    confirm_verifier: bytes = b""
    callback: Any = None  # cb_client4
    callback_ident: int = 0
    callback_path: Any = None
    owners: dict = field(default_factory=dict)
    # an NFSv3 lock host (NLM) holds no lease: NSM tells when it restarted
    leased: bool = True
    # its catalog record says it holds opens or locks (a restart then holds grace for it)
    held_state_recorded: bool = False
    # "other" of its delegations revoked and not yet freed (SEQUENCE says so)
    revoked: set = field(default_factory=set)
    # RPCSEC_GSS: the Kerberos principal that made it (its record shows it to the admin)
    principal_name: str = ""


@dataclass
class OpenState:
    other: bytes
    client: Client
    ino: int
    owner: bytes
    seqid: int = 1
    access: int = 0
    deny: int = 0
    locks: set = field(default_factory=set)
    # the (access, deny) pair of each OPEN merged into this one: an OPEN_DOWNGRADE must name
    # what closing some of them would leave (RFC 7530 16.19.4)
    modes: set = field(default_factory=set)

    kind = "open"


@dataclass
class LockState:
    other: bytes
    client: Client
    ino: int
    owner: bytes
    open: OpenState
    seqid: int = 1
    ranges: list = field(default_factory=list)  # (start, end, type) with end exclusive

    kind = "lock"


@dataclass
class DelegState:
    """A read or write delegation of one file to one client
    (appliance.nfs.state.delegations)."""

    other: bytes
    client: Client
    ino: int
    fh: bytes  # the handle CB_RECALL names
    seqid: int = 1
    recalled_at: float | None = None  # monotonic time of the CB_RECALL
    write: bool = False
    # a write delegation's change attributes: the file's at the grant, the holder's last
    # CB_GETATTR answer, the last the server answered others for it; when it was seen changed
    granted_change: int = 0
    holder_change: int = 0
    reported_change: int = 0
    modified_ns: int | None = None

    kind = "deleg"
