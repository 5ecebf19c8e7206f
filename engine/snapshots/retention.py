"""Retention: "under pattern P keep the newest N entries; delete, trash or cool the rest".

A rule's pattern is an absolute path whose components may hold shell wildcards
(``*``, ``?``, ``[...]``), e.g. ``/checkpoints/*/step-*``. As in a shell, a wildcard
does not match a name starting with '.', so half-written ``.step-9.tmp`` files and
the ``.trash`` directories are never candidates; symbolic links are not followed
on the way down. The entries a pattern matches are grouped by the directory they
sit in, and each group keeps its newest ``keep`` entries: with
``/checkpoints/*/step-*`` every run keeps its own last N checkpoints. "Newest" is
by mtime (ties broken by name), or by the natural sort of names (step-9 < step-10).

Actions on the older entries:
- ``delete``: the entry and its subtree are removed for good (Trash.delete: the
  name disappears in one transaction, then the subtree is removed);
- ``trash``: moved to the export's trash (engine.admin.trash), restorable until purged;
- ``cold``: every file below it is pinned to the cold band class
  (``inodes.band_class``) in one transaction; the tiering engine moves the data.

An entry with anything below it open (Namespace.is_open), holding buffered writes,
or modified within ``settle_s`` seconds is skipped and reported as such. The open
check sees the opens of this process's Namespace only: run rules in the daemon that
serves NFS, or give ``settle_s`` when running them from another process.
Every action, skip and rule change is an event.
"""

from __future__ import annotations

import fnmatch
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from sqlalchemy import select

from engine.admin.crud import CrudService, record_of
from engine.admin.events import record, record_in
from engine.admin.schema import Field, Schema
from engine.admin.trash import TRASH_DIR, Trash
from engine.base import errors
from engine.base.ordered_lock import lock
from engine.catalog.database import Catalog
from engine.catalog.models import DIR, REG, Inode, RetentionPolicy
from engine.namespace import ROOT, Attr, Namespace
from engine.namespace.paths import iter_dir, join_path, split_path, walk_subtree

RULES = RetentionPolicy.__table__
INODES = Inode.__table__

ACTIONS = ("delete", "cold", "trash")
ORDERS = ("mtime", "name")
KEEP_MAX = 1_000_000
COLD = "cold"
MAGIC = re.compile(r"[*?\[]")

Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class RetentionRule:
    id: int
    pattern: str
    keep: int
    order_by: str
    action: str
    enabled: bool
    created_ns: int
    last_run_ns: int | None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class PlannedAction:
    """One thing a rule does (preview) or did (run: ``outcome`` is set)."""

    rule_id: int
    path: str
    action: str  # delete | cold | trash, or "skip" (the entry is left alone: see reason)
    reason: str
    mtime_ns: int
    ino: int
    is_dir: bool
    outcome: str | None = None  # after run: "done", "skipped: ..." or "failed: ..."

    @property
    def mtime(self) -> float:
        return self.mtime_ns / 1e9

    def to_dict(self) -> dict:
        data = asdict(self)
        data["mtime"] = self.mtime
        return data


# -- validation ------------------------------------------------------------------------
def validate_pattern(pattern) -> str:
    if not isinstance(pattern, str) or not pattern.strip():
        raise errors.InvalidArgument(
            f"retention pattern {pattern!r}: expected a non-empty absolute path "
            "pattern such as /checkpoints/*/step-*"
        )
    parts = split_path(pattern.strip(), "retention pattern")
    if not parts:
        raise errors.InvalidArgument(
            f"retention pattern {pattern!r} names the root itself: expected at least "
            "one component below it, such as /checkpoints/*"
        )
    return join_path(parts)


def validate_keep(keep) -> int:
    if isinstance(keep, str) and keep.strip().isdigit():
        keep = int(keep.strip())
    if isinstance(keep, bool) or not isinstance(keep, int) or not 1 <= keep <= KEEP_MAX:
        raise errors.InvalidArgument(
            f"keep {keep!r}: expected a whole number from 1 to {KEEP_MAX} "
            "(how many of the newest entries to keep)"
        )
    return keep


def validate_choice(what: str, value, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise errors.InvalidArgument(f"{what} {value!r}: expected one of {', '.join(choices)}")
    return value


def _pattern(value: str) -> str:
    try:
        return validate_pattern(value)
    except errors.InvalidArgument as exc:  # a form or API field's error is a ValueError
        raise ValueError(exc.strerror) from None


RULE_SCHEMA = Schema(
    "RetentionRule",
    "Keep the newest N entries a path pattern matches; act on the older ones.",
    (
        Field(
            "pattern",
            "string",
            "An absolute path pattern; components may hold * ? [...] wildcards, e.g. "
            "/checkpoints/*/step-* (no '.' or '..' components)",
            min_length=1,
            max_length=1024,
            example="/checkpoints/*/step-*",
            check=_pattern,
        ),
        Field(
            "keep",
            "integer",
            "How many of the newest matches to keep in each directory",
            minimum=1,
            maximum=KEEP_MAX,
            example=3,
        ),
        Field(
            "action",
            "string",
            "What happens to older matches: delete (gone for good, space freed now), trash "
            "(restorable from the export's trash; frees no space until the trash is purged) or "
            "cold (pinned to the cold band class)",
            enum=ACTIONS,
            default="delete",
        ),
        Field(
            "order_by",
            "string",
            "Which entries are newest: by modification time (mtime) or by the natural "
            "sort of names (step-9 < step-10)",
            enum=ORDERS,
            default="mtime",
        ),
        Field(
            "enabled",
            "boolean",
            "Whether the scheduled runs apply this rule",
            required=False,
            default=True,
        ),
    ),
)
UPDATABLE = RULE_SCHEMA.names()


def _validate_fields(fields: dict) -> dict:
    clean: dict[str, object] = {}
    for key, value in fields.items():
        if key == "pattern":
            clean[key] = validate_pattern(value)
        elif key == "keep":
            clean[key] = validate_keep(value)
        elif key == "action":
            clean[key] = validate_choice("retention action", value, ACTIONS)
        elif key == "order_by":
            clean[key] = validate_choice("retention order_by", value, ORDERS)
        elif key == "enabled":
            if not isinstance(value, bool):
                raise errors.InvalidArgument(f"enabled {value!r}: expected true or false")
            clean[key] = value
        else:
            raise errors.InvalidArgument(
                f"retention rule field {key!r}: expected one of {', '.join(UPDATABLE)}"
            )
    return clean


def natural_key(name: str) -> tuple:
    """Sort key that orders digit runs by value: step-9 < step-10 < step-100."""
    chunks = re.split(r"(\d+)", name)
    key = tuple((0, int(c), "") if c.isdigit() else (1, 0, c.casefold()) for c in chunks if c)
    return key, name


def _matches(component: str, name: str) -> bool:
    if name.startswith(".") and not component.startswith("."):
        return False  # shell rule: wildcards do not match hidden names
    if name == TRASH_DIR and component != TRASH_DIR:
        return False
    return fnmatch.fnmatchcase(name, component)


@dataclass(frozen=True)
class _Match:
    path: str
    parent: int
    name: str
    attr: Attr


class _Rules(CrudService[RetentionRule]):
    create_verb = "add"
    name_column = None

    def created(self, new_id: int, made: RetentionRule, values) -> str:
        return (
            f"retention rule {new_id} added: under {made.pattern} "
            f"keep {made.keep} by {made.order_by}, {made.action} the rest"
        )

    def deleted(self, row) -> str:
        return (
            f"retention rule {row.id} deleted (was: under {row.pattern} "
            f"keep {row.keep}, {row.action} the rest)"
        )


RULES_SERVICE = _Rules(
    RULES,
    record_of(RetentionRule),
    noun="retention rule",
    event_prefix="retention.rule",
    id_key="rule_id",
)


class RetentionService:
    def __init__(
        self,
        namespace: Namespace,
        catalog: Catalog,
        *,
        trash: Trash | None = None,
        settle_s: float = 0.0,
        clock: Callable[[], int] = time.time_ns,
    ):
        self.namespace = namespace
        self.catalog = catalog
        self.trash = trash or Trash(namespace, catalog, clock=clock)
        self.settle_s = settle_s
        self.clock = clock
        self._run_lock = lock("retention.run")

    # -- rules -------------------------------------------------------------------------
    def add_rule(
        self,
        pattern: str,
        keep: int,
        action: str = "delete",
        order_by: str = "mtime",
        actor: str = "system",
        enabled: bool = True,
    ) -> int:
        fields = _validate_fields(
            {
                "pattern": pattern,
                "keep": keep,
                "action": action,
                "order_by": order_by,
                "enabled": enabled,
            }
        )
        stored = {"created_ns": self.clock()}
        return RULES_SERVICE.create(self.catalog, fields, actor=actor, stored=stored).id

    def update_rule(self, id: int, actor: str = "system", **fields) -> RetentionRule:
        if not fields:
            raise errors.InvalidArgument(
                f"update of retention rule {id}: no fields given "
                f"(expected some of {', '.join(UPDATABLE)})"
            )
        return RULES_SERVICE.update(self.catalog, id, _validate_fields(fields), actor=actor)

    def delete_rule(self, id: int, actor: str = "system") -> None:
        RULES_SERVICE.delete(self.catalog, id, actor=actor)

    def list_rules(self) -> list[RetentionRule]:
        return RULES_SERVICE.list(self.catalog, "id")

    def get_rule(self, id: int) -> RetentionRule:
        return RULES_SERVICE.get(self.catalog, id)

    def _rules(self, rule_id: int | None) -> list[RetentionRule]:
        if rule_id is not None:
            return [self.get_rule(rule_id)]  # on demand a disabled rule runs too
        return [rule for rule in self.list_rules() if rule.enabled]

    # -- matching ------------------------------------------------------------------------
    def expand(self, pattern: str) -> list[_Match]:
        """Every entry the pattern matches (directories only on the way down)."""
        parts = split_path(validate_pattern(pattern), "retention pattern")
        level = [("", self.namespace.root_ino, "", self.namespace.getattr(self.namespace.root_ino))]
        for depth, component in enumerate(parts):
            last = depth == len(parts) - 1
            following = []
            for path, _parent, _name, attr in level:
                if attr.type != DIR:
                    continue
                if MAGIC.search(component):
                    children = [
                        (e.name, e.attr)
                        for e in iter_dir(self.namespace, attr.ino)
                        if _matches(component, e.name)
                    ]
                else:
                    try:
                        children = [(component, self.namespace.lookup(ROOT, attr.ino, component))]
                    except (errors.NotFound, errors.NotADirectory, errors.StaleHandle):
                        children = []
                for name, child in children:
                    if last or child.type == DIR:
                        following.append((f"{path}/{name}", attr.ino, name, child))
            level = following
        return [_Match(*item) for item in level]

    # -- planning --------------------------------------------------------------------------
    def _busy(self, attr: Attr) -> str | None:
        """Why this entry must be left alone now, or None."""
        settle_ns = int(self.settle_s * 1e9)
        now = self.clock()
        data = self.namespace.data
        for item in walk_subtree(self.namespace, attr):
            if self.namespace.is_open(item.ino):
                return f"open for writing (inode {item.ino})"
            if data is not None and item.type == REG and data.pending_size(item.ino) is not None:
                return f"has buffered writes (inode {item.ino})"
            if settle_ns and now - item.mtime_ns < settle_ns:
                return (
                    f"modified {(now - item.mtime_ns) / 1e9:.0f} s ago, "
                    f"within the {self.settle_s:g} s settle time"
                )
        return None

    def _not_cold(self, attr: Attr) -> list[int]:
        inos = [a.ino for a in walk_subtree(self.namespace, attr) if a.type in (REG, DIR)]
        if not inos:
            return []

        def work(conn):
            found = []
            for start in range(0, len(inos), 500):
                chunk = inos[start : start + 500]
                found += conn.execute(
                    select(INODES.c.ino).where(
                        INODES.c.ino.in_(chunk),
                        (INODES.c.band_class.is_(None)) | (INODES.c.band_class != COLD),
                    )
                ).scalars()
            return found

        return self.catalog.read(work)

    def _plan_rule(self, rule: RetentionRule) -> list[PlannedAction]:
        groups: dict[int, list[_Match]] = {}
        for match in self.expand(rule.pattern):
            groups.setdefault(match.parent, []).append(match)
        planned = []
        for members in groups.values():
            if rule.order_by == "name":
                members.sort(key=lambda m: natural_key(m.name), reverse=True)
                order = "by name"
            else:
                members.sort(key=lambda m: (m.attr.mtime_ns, natural_key(m.name)), reverse=True)
                order = "by mtime"
            parent_path = members[0].path.rsplit("/", 1)[0] or "/"
            for rank, match in enumerate(members[rule.keep :], start=rule.keep + 1):
                reason = (
                    f"number {rank} of {len(members)} {order} in {parent_path}; "
                    f"rule {rule.id} keeps {rule.keep}"
                )
                busy = self._busy(match.attr)
                action = rule.action
                if busy:
                    action, reason = "skip", f"{busy}; {reason}"
                elif rule.action == "cold" and not self._not_cold(match.attr):
                    continue  # pinned to cold already: nothing would happen
                planned.append(
                    PlannedAction(
                        rule.id,
                        match.path,
                        action,
                        reason,
                        match.attr.mtime_ns,
                        match.attr.ino,
                        match.attr.type == DIR,
                    )
                )
        planned.sort(key=lambda p: natural_key(p.path))
        return planned

    def preview(self, rule_id: int | None = None) -> list[PlannedAction]:
        """Exactly what ``run`` would do now, changing nothing (skips included, action "skip")."""
        planned = []
        for rule in self._rules(rule_id):
            planned += self._plan_rule(rule)
        return planned

    # -- running -----------------------------------------------------------------------------
    def run(
        self, rule_id: int | None = None, actor: str = "system", progress: Progress | None = None
    ) -> list[PlannedAction]:
        """Apply the rules (one, or every enabled one); returns each action with its outcome."""
        with self._run_lock:
            rules = self._rules(rule_id)
            planned = []
            for rule in rules:
                planned += self._plan_rule(rule)
            results = []
            for done, item in enumerate(planned):
                if progress:
                    progress(done, len(planned), f"{item.action} {item.path}")
                results.append(self._apply(item, actor))
            stamp = self.clock()
            ids = [rule.id for rule in rules]

            def finish(conn):
                if ids:
                    conn.execute(
                        RULES.update().where(RULES.c.id.in_(ids)).values(last_run_ns=stamp)
                    )
                counts: dict[str, int] = {}
                for item in results:
                    outcome = item.outcome
                    assert outcome is not None  # _apply returns each item with its outcome set
                    key = (
                        item.action
                        if outcome == "done"
                        else "skip"
                        if outcome.startswith("skipped")
                        else "failed"
                    )
                    counts[key] = counts.get(key, 0) + 1
                record_in(
                    conn,
                    "retention.run",
                    f"retention ran {len(rules)} rule(s): "
                    + (", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "nothing to do"),
                    actor=actor,
                    severity="warning" if counts.get("failed") else "info",
                    details={"rules": ids, "counts": counts},
                )

            self.catalog.run(finish)
            if progress:
                progress(len(planned), len(planned), "retention done")
            return results

    def _apply(self, item: PlannedAction, actor: str) -> PlannedAction:
        details = {
            "rule_id": item.rule_id,
            "path": item.path,
            "ino": item.ino,
            "reason": item.reason,
        }
        if item.action == "skip":
            record(
                self.catalog,
                "retention.skip",
                f"retention rule {item.rule_id} left {item.path} alone: {item.reason}",
                actor=actor,
                severity="warning",
                details=details,
            )
            return replace(item, outcome="skipped: " + item.reason)
        # The tree may have changed since planning: check the entry again right before acting.
        try:
            attr = self.namespace.resolve(item.path, follow=False)
            if attr.ino != item.ino:
                raise errors.StaleHandle(f"{item.path} now names another entry")
            busy = self._busy(attr)
        except (errors.NotFound, errors.StaleHandle, errors.NotADirectory) as exc:
            return replace(
                item, outcome=f"skipped: gone or replaced since planning ({exc.strerror})"
            )
        if busy:
            record(
                self.catalog,
                "retention.skip",
                f"retention rule {item.rule_id} left {item.path} alone: {busy}",
                actor=actor,
                severity="warning",
                details={**details, "reason": busy},
            )
            return replace(item, outcome="skipped: " + busy)
        try:
            if item.action == "delete":
                self.trash.delete(
                    item.path,
                    actor,
                    event_kind="retention.delete",
                    expect_ino=item.ino,
                    details=details,
                )
            elif item.action == "trash":
                self.trash.move_to_trash(
                    item.path, actor, event_kind="retention.trash", details=details
                )
            elif item.action == "cold":
                self._pin_cold(item, attr, actor, details)
        except errors.FsError as exc:
            record(
                self.catalog,
                "retention.failed",
                f"retention rule {item.rule_id} could not {item.action} "
                f"{item.path}: {exc.strerror}",
                actor=actor,
                severity="error",
                details=details,
            )
            return replace(item, outcome=f"failed: {exc.strerror}")
        return replace(item, outcome="done")

    def _pin_cold(self, item: PlannedAction, attr: Attr, actor: str, details: dict) -> None:
        inos = self._not_cold(attr)

        def work(conn):
            for start in range(0, len(inos), 500):
                conn.execute(
                    INODES.update()
                    .where(INODES.c.ino.in_(inos[start : start + 500]))
                    .values(band_class=COLD)
                )
            record_in(
                conn,
                "retention.cold",
                f"retention rule {item.rule_id} pinned {item.path} to the cold class "
                f"({len(inos)} inodes; tiering moves the data)",
                actor=actor,
                details={**details, "inodes": len(inos)},
            )

        self.catalog.run(work)


def plan_to_text(items: list[PlannedAction]) -> str:
    """Plain table for the CLI's ``retention preview``."""
    if not items:
        return "nothing to do"
    lines = []
    for item in items:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(item.mtime_ns // 10**9))
        tail = f"  [{item.outcome}]" if item.outcome else ""
        lines.append(
            f"rule {item.rule_id:<4} {item.action:<6} {when}  {item.path}  ({item.reason}){tail}"
        )
    return "\n".join(lines)
