"""NFSv4 clients as the catalog records them, with their principals and the delegations each
holds: what the web UI's exports page and the API (GET /api/v1/nfs/clients) show.

The NFS server keeps its clients in memory and writes what must outlive it to the catalog:
one ``nfs_clients`` row per confirmed client (appliance/nfs/state/records.py; ``principal`` is
the JSON ``[flavour, uid, Kerberos name]``) and one settings row per delegation,
``nfs_delegation_<inode>_<stateid other>`` = {head, client id, owner, type, grant time, and
the recall time once recalled} (appliance/nfs/state/delegations.py). This module only reads
them."""

from __future__ import annotations

import json

from sqlalchemy import select

from engine.catalog.database import Catalog
from engine.catalog.models import Dirent, NfsClient, Setting
from engine.namespace.common import ROOT_INO_KEY

CLIENTS = NfsClient.__table__
SETTINGS = Setting.__table__
DIRENTS = Dirent.__table__
DELEG_PREFIX = "nfs_delegation_"  # the settings rows of delegations (one per delegation)
FLAVOURS = {0: "none", 1: "sys", 6: "krb5"}
PATH_DEPTH_MAX = 256


def principal_text(recorded: str | None) -> str:
    """``[flavour, uid, name]`` as an admin reads it: ``sys uid 1000``, ``krb5 alice@REALM
    (uid 1000)``; ``unknown`` for a record made before principals were kept."""
    try:
        flavour, uid, *rest = json.loads(recorded or "")
    except (ValueError, TypeError):
        return "unknown"
    name = rest[0] if rest and rest[0] else ""
    kind = FLAVOURS.get(flavour, f"flavour {flavour}")
    who = "no local user" if uid == -1 else f"uid {uid}"  # appliance.nfs.onc.rpc.UNMAPPED
    return f"{kind} {name} ({who})" if name else f"{kind} {who}"


def list_clients(catalog: Catalog) -> list[dict]:
    """Every recorded NFSv4 client, newest first, each with its delegations (inode, path,
    type, grant time in ns, recall time in ns or None); delegations whose client has no
    record are listed under a client of their own (client id known, nothing else)."""

    def work(conn):
        rows = conn.execute(
            select(
                CLIENTS.c.clientid,
                CLIENTS.c.owner,
                CLIENTS.c.address,
                CLIENTS.c.minor_version,
                CLIENTS.c.principal,
                CLIENTS.c.held_state,
                CLIENTS.c.head,
                CLIENTS.c.last_seen_ns,
            )
            .where(CLIENTS.c.confirmed.is_(True))
            .order_by(CLIENTS.c.last_seen_ns.desc())
        ).all()
        delegations = conn.execute(
            select(SETTINGS.c.key, SETTINGS.c.value).where(SETTINGS.c.key.like(DELEG_PREFIX + "%"))
        ).all()
        root = conn.execute(select(SETTINGS.c.value).where(SETTINGS.c.key == ROOT_INO_KEY)).scalar()
        root_ino = int(root) if root is not None else None
        held: dict[str, list[dict]] = {}
        for row in delegations:
            try:
                rec = json.loads(row.value)
                ino = int(row.key[len(DELEG_PREFIX) :].split("_")[0])
                entry = {
                    "inode": ino,
                    "path": _path_of(conn, ino, root_ino),
                    "type": str(rec["type"]),
                    "granted_ns": int(rec["granted_ns"]),
                    "clientid": f"{int(rec['clientid']):x}",
                    # when the server recalled it (a conflicting change waits), else None
                    "recalled_ns": int(rec["recalled_ns"]) if "recalled_ns" in rec else None,
                }
                held.setdefault(str(rec["owner"]), []).append(entry)
            except (ValueError, KeyError, TypeError):
                continue  # a row the server could not use either
        out = []
        for r in rows:
            owner = bytes(r.owner).hex()
            mine = sorted(held.pop(owner, []), key=lambda d: d["inode"])
            out.append(
                {
                    # the record keeps 63 bits; a delegation's row the whole id
                    "clientid": mine[0]["clientid"] if mine else f"{r.clientid:x}",
                    "address": r.address or "",
                    "version": f"4.{r.minor_version}",
                    "principal": principal_text(r.principal),
                    "holds_state": bool(r.held_state),
                    "head": r.head,
                    "last_seen_ns": r.last_seen_ns,
                    "delegations": mine,
                }
            )
        for entries in held.values():  # a delegation outliving its client's record
            out.append(
                {
                    "clientid": entries[0]["clientid"],
                    "address": "",
                    "version": "",
                    "principal": "unknown",
                    "holds_state": True,
                    "head": "",
                    "last_seen_ns": None,
                    "delegations": sorted(entries, key=lambda d: d["inode"]),
                }
            )
        return out

    return catalog.read(work)


def _path_of(conn, ino: int, root_ino: int | None) -> str:
    """One path to ``ino`` from the namespace root, "" when it is not linked (removed)."""
    parts: list[str] = []
    current = ino
    for _ in range(PATH_DEPTH_MAX):
        if current == root_ino:
            return "/" + "/".join(reversed(parts))
        row = conn.execute(
            select(DIRENTS.c.parent, DIRENTS.c.name).where(DIRENTS.c.child == current).limit(1)
        ).first()
        if row is None:
            return ""
        parts.append(row.name)
        current = row.parent
    return ""
