"""Tiering thresholds and pinned paths, as the admin sets them (web UI, API).

Thresholds live in the catalog's settings as ``tiering.<TieringPolicy field>``
(seconds, as engine.lifecycle.tiering.TieringPolicy takes them), and pinned
paths as ``tiering.path_rules`` (JSON [[path, class], ...]), so that the
daemon's tiering job builds its policy from them at each run
(engine.lifecycle.jobs.tiering_policy). A pin also sets ``inodes.band_class``
on the path and everything below it at once, as retention's "cold" action
does; the rule covers files created there later."""

from __future__ import annotations

import json

from sqlalchemy import select

from engine.admin.events import record_in
from engine.base import errors
from engine.catalog.database import Catalog
from engine.catalog.models import Dirent, Inode, Setting

INODES = Inode.__table__
DIRENTS = Dirent.__table__
SETTINGS = Setting.__table__
SETTING_PREFIX = "tiering."
PATH_RULES_KEY = SETTING_PREFIX + "path_rules"
CLASSES = ("hot", "warm", "cold")
UNPIN = "none"
PIN_LIST_LIMIT = 500
DAY = 86400
# the thresholds an admin sets, and what each is while unset
THRESHOLD_DEFAULTS = {
    "hot_to_warm_after_s": 600,
    "warm_to_cold_after_s": 30 * DAY,
    "promote_reads": 3,
    "promote_window_s": DAY,
}


def thresholds(catalog: Catalog) -> dict[str, int]:
    out = {}
    for name, default in THRESHOLD_DEFAULTS.items():
        raw = catalog.get_setting(SETTING_PREFIX + name)
        out[name] = int(raw) if raw is not None else default
    return out


def set_thresholds(catalog: Catalog, values: dict[str, int], *, actor: str) -> dict[str, int]:
    """Store the given thresholds (already checked against their bounds); returns all of them."""
    unknown = sorted(set(values) - set(THRESHOLD_DEFAULTS))
    if unknown:
        raise errors.InvalidArgument(
            f"tiering threshold {unknown[0]!r}: expected one of {', '.join(THRESHOLD_DEFAULTS)}"
        )

    def work(conn):
        for name, value in values.items():
            key = SETTING_PREFIX + name
            if not conn.execute(
                SETTINGS.update().where(SETTINGS.c.key == key).values(value=str(value))
            ).rowcount:
                conn.execute(SETTINGS.insert().values(key=key, value=str(value)))
        record_in(
            conn,
            "tiering.thresholds",
            "tiering thresholds changed: " + ", ".join(f"{k}={v}" for k, v in values.items()),
            actor=actor,
            details=values,
        )

    catalog.run(work)
    return thresholds(catalog)


def path_rules(catalog: Catalog) -> list[list[str]]:
    raw = catalog.get_setting(PATH_RULES_KEY)
    return json.loads(raw) if raw else []


def pinned(catalog: Catalog, namespace, limit: int = PIN_LIST_LIMIT) -> list[dict]:
    """Pinned inodes whose parent is not pinned to the same class: the tops of pinned trees."""

    def work(conn):
        rows = conn.execute(
            select(INODES.c.ino, INODES.c.band_class)
            .where(INODES.c.band_class.is_not(None))
            .order_by(INODES.c.ino)
            .limit(limit * 20)
        ).all()
        classes = {r.ino: r.band_class for r in rows}
        parents = {}
        for start in range(0, len(rows), 500):
            chunk = [r.ino for r in rows[start : start + 500]]
            parents.update(
                dict(
                    conn.execute(
                        select(DIRENTS.c.child, DIRENTS.c.parent).where(DIRENTS.c.child.in_(chunk))
                    ).all()
                )
            )
        return [(ino, cls) for ino, cls in classes.items() if classes.get(parents.get(ino)) != cls]

    tops = catalog.read(work)[:limit]
    out = []
    for ino, cls in tops:
        try:
            path = namespace.path_of(ino)
        except errors.FsError:
            continue  # unlinked but still open: not something an admin can unpin by path
        out.append({"ino": ino, "path": path, "band_class": cls})
    return out


def pin(catalog: Catalog, namespace, path: str, band_class: str, *, actor: str) -> int:
    """Pin a path to a class (or with 'none' unpin it): its rule, and the band class of the path
    and everything below it now; returns the inodes changed."""
    from engine.namespace.paths import join_path, split_path, walk_subtree

    if band_class not in CLASSES + (UNPIN,):
        raise errors.InvalidArgument(
            f"band_class = {band_class!r}: expected one of {', '.join(CLASSES + (UNPIN,))}"
        )
    path = join_path(split_path(path, "pin path"))
    attr = namespace.resolve(path, follow=False)
    inos = [a.ino for a in walk_subtree(namespace, attr)]
    value = None if band_class == UNPIN else band_class

    def work(conn):
        raw = conn.execute(
            select(SETTINGS.c.value).where(SETTINGS.c.key == PATH_RULES_KEY)
        ).scalar()
        rules = [r for r in (json.loads(raw) if raw else []) if r[0] != path]
        if value is not None:
            rules = sorted(rules + [[path, value]])
        if raw is None:
            conn.execute(SETTINGS.insert().values(key=PATH_RULES_KEY, value=json.dumps(rules)))
        else:
            conn.execute(
                SETTINGS.update()
                .where(SETTINGS.c.key == PATH_RULES_KEY)
                .values(value=json.dumps(rules))
            )
        for start in range(0, len(inos), 500):
            conn.execute(
                INODES.update()
                .where(INODES.c.ino.in_(inos[start : start + 500]))
                .values(band_class=value)
            )
        message = (
            f"{path} unpinned" if value is None else f"{path} pinned to the {value} class"
        ) + f" ({len(inos)} inodes; tiering moves the data)"
        record_in(
            conn,
            "tiering.pin",
            message,
            actor=actor,
            details={"path": path, "band_class": value, "inodes": len(inos)},
        )

    catalog.run(work)
    return len(inos)
