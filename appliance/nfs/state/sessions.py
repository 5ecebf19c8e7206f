"""Sessions that survive a restart, so that a client carries on: one settings row each
(``nfs_session_<id>``), saved when the session is made and at RECLAIM_COMPLETE, dropped with
the session, and read back at start. A restored session's slots accept the next seqid; its
client, when it held opens or locks, must reclaim them (SEQUENCE's RESTART_RECLAIM_NEEDED)."""

from __future__ import annotations

import json
import logging

from sqlalchemy import delete, select

from appliance.nfs.state.core import StateCore
from appliance.nfs.state.model import Client, Session, Slot
from appliance.nfs.v4 import const as c
from appliance.nfs.v4.types import authsys_parms, channel_attrs4
from engine.catalog.models import Setting

log = logging.getLogger("shingle.nfs.state")

SETTINGS = Setting.__table__
SESSION_PREFIX = "nfs_session_"


def new_session(sid: bytes, cl: Client, nslots: int, fore, back, seqid: int | None = 0) -> Session:
    """A session of ``nslots`` slots whose limits are the fore channel's."""
    return Session(
        sid,
        cl,
        [Slot(seqid=seqid) for _ in range(nslots)],
        fore,
        back,
        fore.maxoperations,
        fore.maxresponsesize_cached,
        fore.maxrequestsize,
        fore.maxresponsesize,
    )


def _callback_record(callback) -> list | None:
    """A session's (cb_program, callback_sec_parms4) as JSON: AUTH_NONE and AUTH_SYS with
    their credentials, RPCSEC_GSS as its flavour alone (its context does not outlive the
    process: the restored session asks the client for a new one)."""
    if callback is None:
        return None
    program, sec_parms = callback
    flavors: list = []
    for flavor, arm in sec_parms:
        if flavor == c.AUTH_NONE:
            flavors.append([flavor])
        elif flavor == c.AUTH_SYS:
            flavors.append([flavor, arm.stamp, arm.machinename, arm.uid, arm.gid, list(arm.gids)])
        elif flavor == c.RPCSEC_GSS:
            flavors.append([flavor])
    return [program, flavors]


def _callback_from(rec) -> tuple | None:
    if not rec:
        return None
    program, flavors = rec
    sec = []
    for item in flavors:
        if item[0] == c.AUTH_SYS:
            sec.append((c.AUTH_SYS, authsys_parms.cls(*item[1:5], [int(g) for g in item[5]])))
        elif item[0] == c.RPCSEC_GSS:
            sec.append((c.RPCSEC_GSS, None))
        else:
            sec.append((c.AUTH_NONE, None))
    return (int(program), sec)


class SessionRecords:
    def __init__(self, core: StateCore):
        self.core = core
        self.catalog = core.catalog

    def _record(self, sess: Session) -> str:
        cl = sess.client
        return json.dumps(
            {
                "head": self.core.head_name,
                "clientid": cl.clientid,
                "owner": cl.owner.hex(),
                "verifier": cl.verifier.hex(),
                "principal": list(cl.principal),
                "address": cl.address,
                "cs_sequence": cl.cs_sequence,
                "reclaim_complete": cl.reclaim_complete,
                "slots": len(sess.slots),
                "fore": list(sess.fore)[:-1],
                "back": list(sess.back)[:-1],
                "callback": _callback_record(sess.callback),
            }
        )

    def save(self, sess: Session) -> None:
        self.catalog.set_setting(SESSION_PREFIX + sess.id.hex(), self._record(sess))

    def drop(self, sid: bytes) -> None:
        self._delete(SESSION_PREFIX + sid.hex())

    def _delete(self, key: str) -> None:
        self.catalog.run(lambda conn: conn.execute(delete(SETTINGS).where(SETTINGS.c.key == key)))

    def restore(self) -> None:
        """At start: the previous instance's sessions, with their clients (after the client
        records told ``core.reclaimable``)."""
        rows = self.catalog.read(
            lambda conn: conn.execute(
                select(SETTINGS.c.key, SETTINGS.c.value).where(
                    SETTINGS.c.key.like(SESSION_PREFIX + "%")
                )
            ).all()
        )
        core = self.core
        for row in rows:
            try:
                rec = json.loads(row.value)
                if rec.get("head", "") != core.head_name:
                    continue  # another head's session
                sid = bytes.fromhex(row.key[len(SESSION_PREFIX) :])
                owner = bytes.fromhex(rec["owner"])
                cl = core.by_owner.get(owner)
                if cl is None:
                    cl = self._restored_client(owner, rec)
                fore = channel_attrs4.cls(*rec["fore"], [])
                back = channel_attrs4.cls(*rec["back"], [])
                sess = new_session(sid, cl, int(rec["slots"]), fore, back, seqid=None)
                sess.callback = _callback_from(rec.get("callback"))
                core.slot_replies.reserve(sess)
                core.sessions[sid] = sess
                cl.sessions[sid] = sess
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("session record %s unreadable (%s): dropped", row.key, exc)
                self._delete(row.key)
        if rows:
            log.info("restored %d sessions of %d clients", len(core.sessions), len(core.clients))

    def _restored_client(self, owner: bytes, rec: dict) -> Client:
        core = self.core
        cl = Client(
            int(rec["clientid"]),
            owner,
            bytes.fromhex(rec["verifier"]),
            tuple(rec["principal"]),
            rec["address"],
            confirmed=True,
            cs_sequence=int(rec["cs_sequence"]),
            reclaim_complete=bool(rec["reclaim_complete"]),
        )
        # only a client that held opens or locks has something to reclaim; one that ignores
        # SEQUENCE's flag (nfs-rs) still opens once the grace period is over; the Linux
        # client reclaims
        held = owner in core.reclaimable
        cl.may_reclaim = cl.reclaim_needed = cl.held_state_recorded = held
        core.clients[cl.clientid] = cl
        core.by_owner[owner] = cl
        return cl
