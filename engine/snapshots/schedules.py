"""Snapshot schedules: periodic snapshots of a dataset, kept by keep-last-N and keep-for.

A schedule (table ``snapshot_schedules``) names a dataset (a directory path), a frequency and
when in its period it fires (all in UTC):
- ``hourly`` at minute ``at`` ("15" or ":15"), ``daily`` at ``at`` "HH:MM", ``weekly`` at
  ``at`` "Mon HH:MM";
- ``interval``: every ``interval_s`` seconds (at least 60), slots counted from the Unix epoch.
Each slot's snapshot is named ``PREFIX-YYYY-MM-DDTHHMMZ`` after the slot's time, so names sort
by time; the snapshots whose names match that pattern are the schedule's (two schedules of one
dataset need different prefixes). A daemon that was down takes one snapshot, for the latest
missed slot, not one per missed slot; a new schedule's first snapshot is at its next slot.

Retention: with ``keep_last`` N the newest N stay, with ``keep_for_s`` those whose slot (the
time in the name) is younger than it stay; with both a snapshot stays when either keeps it,
with neither all stay. Snapshots the schedule does not name are never touched.

``preview()`` says exactly what ``run()`` would do now (the due snapshots, the deletions, each
with its reason) and changes nothing, as file retention's preview (engine/snapshots/retention.py).
The daemon's maintenance queues a ``snapshot-schedule`` job when a schedule is due; the job calls
``run()``. Snapshots are made and deleted through engine/snapshots/service.py's public methods."""

from __future__ import annotations

import calendar
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from sqlalchemy import select

from engine.admin.crud import CrudService, record_of
from engine.admin.events import record_in
from engine.admin.schema import Field, Schema
from engine.base import errors
from engine.base.ordered_lock import lock
from engine.base.units import format_duration, format_size, parse_duration
from engine.catalog.models import DIR, SnapshotSchedule
from engine.namespace.paths import join_path, split_path
from engine.snapshots.service import SnapshotInfo, Snapshots

SCHEDULES = SnapshotSchedule.__table__
FREQUENCIES = ("hourly", "daily", "weekly", "interval")
PERIOD_S = {"hourly": 3600, "daily": 86400, "weekly": 7 * 86400}
WEEK_ANCHOR_S = 4 * 86400  # 1970-01-05 00:00 UTC was a Monday: weekly slots count from it
DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
MIN_INTERVAL_S = 60  # names carry minutes: two slots must not share one
NAME_TIME = "%Y-%m-%dT%H%MZ"
PREFIX_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}"
DEFAULT_PREFIX = "auto"
KEEP_MAX = 100_000
PATH_MAX = 4096
UPDATABLE = (
    "path",
    "frequency",
    "at",
    "interval_s",
    "prefix",
    "keep_last",
    "keep_for_s",
    "enabled",
)

Progress = Callable[[int, int, str], None]


# -- slots and names -----------------------------------------------------------------------
def parse_at(frequency: str, at: str | None) -> int:
    """Seconds into the period at which ``frequency`` fires (``at`` None: its start)."""
    text = (at or "").strip().lower()
    if frequency == "interval":
        if text:
            raise errors.InvalidArgument(
                f"at {at!r}: an interval schedule has no time of day (it counts from the epoch)"
            )
        return 0
    if frequency == "hourly":
        match = re.fullmatch(r":?(\d{1,2})", text or "0")
        if not match or int(match.group(1)) > 59:
            raise errors.InvalidArgument(
                f"at {at!r}: expected the minute of the hour, 0-59 (e.g. 15 or :15)"
            )
        return int(match.group(1)) * 60
    day = 0
    if frequency == "weekly":
        match = re.fullmatch(r"([a-z]{3})[a-z]*\s*(.*)", text or "mon")
        if not match or match.group(1) not in DAYS:
            raise errors.InvalidArgument(
                f"at {at!r}: expected a weekday and a time such as 'Mon 03:00'"
            )
        day, text = DAYS.index(match.group(1)), match.group(2)
    match = re.fullmatch(r"(\d{1,2}):(\d{2})", text or "00:00")
    if not match or int(match.group(1)) > 23 or int(match.group(2)) > 59:
        example = "'Mon 03:00'" if frequency == "weekly" else "03:00"
        raise errors.InvalidArgument(f"at {at!r}: expected a UTC time HH:MM such as {example}")
    return day * 86400 + int(match.group(1)) * 3600 + int(match.group(2)) * 60


def format_at(frequency: str, offset_s: int) -> str:
    """The ``at`` text of an offset (what parse_at reads back)."""
    if frequency == "interval":
        return ""
    if frequency == "hourly":
        return f":{offset_s // 60:02d}"
    hhmm = f"{offset_s % 86400 // 3600:02d}:{offset_s % 3600 // 60:02d}"
    if frequency == "weekly":
        return f"{DAYS[offset_s // 86400].capitalize()} {hhmm}"
    return hhmm


def latest_slot(frequency: str, interval_s: int, offset_s: int, now_s: float) -> int:
    """The newest slot (seconds since the epoch) at or before ``now_s``."""
    base = (WEEK_ANCHOR_S if frequency == "weekly" else 0) + offset_s
    return base + int((now_s - base) // interval_s) * interval_s


def snapshot_name(prefix: str, slot_s: int) -> str:
    return f"{prefix}-{time.strftime(NAME_TIME, time.gmtime(slot_s))}"


def slot_of(name: str) -> int:
    """The slot time (seconds since the epoch) a schedule's snapshot name carries."""
    stamp = name.rsplit("-", 3)[-3:]
    return calendar.timegm(time.strptime("-".join(stamp), NAME_TIME))


def name_pattern(prefix: str) -> re.Pattern:
    """The names a schedule of ``prefix`` gives its snapshots (and only those)."""
    return re.compile(re.escape(prefix) + r"-\d{4}-\d{2}-\d{2}T\d{4}Z")


# -- records ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Schedule:
    id: int
    path: str
    frequency: str
    interval_s: int
    offset_s: int
    prefix: str
    keep_last: int | None
    keep_for_s: int | None
    enabled: bool
    created_ns: int
    last_slot_s: int
    last_run_ns: int | None
    last_error: str | None

    @property
    def at(self) -> str:
        return format_at(self.frequency, self.offset_s)

    def next_slot_s(self, now_s: float) -> int:
        return latest_slot(self.frequency, self.interval_s, self.offset_s, now_s) + self.interval_s

    def due(self, now_s: float) -> bool:
        slot = latest_slot(self.frequency, self.interval_s, self.offset_s, now_s)
        return self.enabled and slot > self.last_slot_s

    def describe(self) -> str:
        when = {
            "hourly": f"hourly at {self.at}",
            "daily": f"daily at {self.at} UTC",
            "weekly": f"weekly on {self.at} UTC",
            "interval": f"every {format_duration(self.interval_s)}",
        }[self.frequency]
        return f"{when}, keeping {self.keeps()}"

    def keeps(self) -> str:
        keep = []
        if self.keep_last is not None:
            keep.append(f"the newest {self.keep_last}")
        if self.keep_for_s is not None:
            keep.append(f"those younger than {format_duration(self.keep_for_s)}")
        return " and ".join(keep) if keep else "all"

    def to_dict(self, now_s: float | None = None) -> dict:
        data = asdict(self)
        data["at"] = self.at
        data["next_ns"] = self.next_slot_s(time.time() if now_s is None else now_s) * 10**9
        data["summary"] = self.describe()
        return data


@dataclass(frozen=True)
class PlannedSnapshotAction:
    """One thing a schedule run does (preview) or did (run: ``outcome`` is set)."""

    schedule_id: int
    path: str  # the dataset
    name: str  # the snapshot
    action: str  # create | delete, or "skip" (the schedule cannot run: see reason)
    reason: str
    created_ns: int  # when it was taken (create: the slot's time)
    unique_bytes: int  # what deleting it frees (0 for a create)
    outcome: str | None = None  # after run: "done", "skipped: ..." or "failed: ..."

    def to_dict(self) -> dict:
        return asdict(self)


_schedule = record_of(Schedule)


def _optional_int(what: str, value, minimum: int, maximum: int | None = None) -> int | None:
    if value is None or value == "":
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < minimum
        or (maximum is not None and value > maximum)
    ):
        top = f" to {maximum}" if maximum is not None else " or more"
        raise errors.InvalidArgument(
            f"{what} {value!r}: expected a whole number from {minimum}{top}"
        )
    return value


# -- the fields the web UI's forms and the REST API take ----------------------------------------
def _duration(text: str) -> int:
    if not text.strip():
        return 0
    return round(parse_duration(text))  # its ValueError names the value and what was expected


DATASET_FIELD = Field(
    "path",
    "string",
    "The dataset: a directory of the namespace, e.g. /datasets/web",
    min_length=1,
    max_length=PATH_MAX,
    example="/datasets/web",
)
SCHEDULE_SCHEMA = Schema(
    "SnapshotScheduleInput",
    "Periodic snapshots of a dataset, named PREFIX-YYYY-MM-DDTHHMMZ after their slot (UTC), "
    "deleted once no keep rule keeps them",
    (
        DATASET_FIELD,
        Field(
            "frequency",
            "string",
            "hourly, daily, weekly, or interval (every interval_s seconds)",
            enum=FREQUENCIES,
            default="daily",
        ),
        Field(
            "at",
            "string",
            "When in the period, UTC: hourly the minute (:15), daily HH:MM, weekly 'Mon HH:MM' "
            "(empty: the period's start)",
            required=False,
            max_length=32,
            example="03:00",
        ),
        Field(
            "interval_s",
            "integer",
            f"Seconds between snapshots of an interval schedule ({MIN_INTERVAL_S} or more)",
            required=False,
            minimum=MIN_INTERVAL_S,
        ),
        Field(
            "prefix",
            "string",
            "Names start with it (1-32 letters, digits, _ . -); two schedules of a dataset need "
            "different ones",
            required=False,
            max_length=32,
            pattern=PREFIX_PATTERN,
            default=DEFAULT_PREFIX,
        ),
        Field(
            "keep_last",
            "integer",
            "Keep the newest N (0 or empty: no count rule)",
            required=False,
            minimum=0,
            maximum=KEEP_MAX,
            example=24,
        ),
        Field(
            "keep_for",
            "string",
            "Keep those younger than this: seconds or a duration such as 36h or 30d "
            "(0 or empty: no age rule)",
            required=False,
            max_length=32,
            example="30d",
            check=_duration,
        ),
        Field("enabled", "boolean", "Whether the daemon takes it", required=False, default=True),
    ),
)


def engine_fields(values: dict, *, partial: bool = False) -> dict:
    """Form or API values -> SnapshotScheduler fields (keep 0 or empty: no such rule)."""
    out = dict(values)
    if "keep_for" in out:
        out["keep_for_s"] = out.pop("keep_for") or None
    elif not partial:
        out["keep_for_s"] = None
    if "keep_last" in out:
        out["keep_last"] = out["keep_last"] or None
    elif not partial:
        out["keep_last"] = None
    if not partial and not out.get("at"):
        out.pop("at", None)
    return out


class _Schedules(CrudService[Schedule]):
    create_verb = "add"
    name_column = None  # a prefix is taken per dataset instead

    def check_free(self, conn, values, own_id: int | None) -> None:
        row = conn.execute(
            select(SCHEDULES.c.id).where(
                SCHEDULES.c.path == values["path"], SCHEDULES.c.prefix == values["prefix"]
            )
        ).first()
        if row is not None and row.id != own_id:
            raise errors.Exists(
                f"schedule {row.id} of {values['path']} already names its snapshots "
                f"{values['prefix']}-...: give this one another prefix"
            )

    def created(self, new_id: int, made: Schedule, values) -> str:
        return f"snapshot schedule {new_id} added: {made.path} {made.describe()}"

    def changed(self, row_id: int, made: Schedule, values) -> str:
        return f"snapshot schedule {row_id} changed: {made.path} {made.describe()}"

    def deleted(self, row) -> str:
        return (
            f"snapshot schedule {row.id} deleted (was: {row.path} "
            f"{_schedule(row).describe()}); its snapshots stay"
        )


SCHEDULES_SERVICE = _Schedules(
    SCHEDULES,
    _schedule,
    noun="snapshot schedule",
    event_prefix="snapshot.schedule",
    id_key="schedule_id",
)


class SnapshotScheduler:
    """Schedules in the catalog and their runs, through a Namespace (and its data path, if any:
    the daemon's flushes buffered writes before each snapshot)."""

    def __init__(self, namespace, *, snapshots: Snapshots | None = None, clock=time.time_ns):
        self.ns = namespace
        self.catalog = namespace.catalog
        self.snapshots = snapshots or Snapshots(namespace)
        self.clock = clock
        self._run_lock = lock("snapshot_schedules.run")

    # -- validation ------------------------------------------------------------------------
    def _dataset_path(self, path) -> str:
        if not isinstance(path, str) or not path.strip():
            raise errors.InvalidArgument(f"dataset path {path!r}: expected an absolute path")
        clean = join_path(split_path(path.strip(), "dataset path"))
        attr = self.ns.resolve(clean)
        if attr.type != DIR:
            raise errors.NotADirectory(f"{clean}: a dataset is a directory")
        if self.ns.is_read_only(attr.ino):
            raise errors.ReadOnly(f"{clean} is inside a snapshot")
        return clean

    def _values(self, fields: dict, current: Schedule | None = None) -> dict:
        """Row values from the fields given (over ``current``'s, for an update)."""
        unknown = set(fields) - set(UPDATABLE)
        if unknown:
            raise errors.InvalidArgument(
                f"snapshot schedule field {sorted(unknown)[0]!r}: expected some of "
                + ", ".join(UPDATABLE)
            )
        merged: dict = {} if current is None else current.to_dict()
        merged.update(fields)
        frequency = merged.get("frequency")
        if frequency not in FREQUENCIES:
            raise errors.InvalidArgument(
                f"frequency {frequency!r}: expected one of {', '.join(FREQUENCIES)}"
            )
        if frequency == "interval":
            interval = _optional_int("interval_s", merged.get("interval_s"), MIN_INTERVAL_S)
            if interval is None:
                raise errors.InvalidArgument(
                    f"interval_s: an interval schedule needs it (seconds, {MIN_INTERVAL_S} or more)"
                )
            at = None
        else:
            interval = PERIOD_S[frequency]
            # the old time of day does not carry over to another frequency
            keep_at = current is None or "frequency" not in fields or frequency == current.frequency
            at = merged.get("at") if ("at" in fields or keep_at) else None
        prefix = merged.get("prefix") or DEFAULT_PREFIX
        if not isinstance(prefix, str) or not re.fullmatch(PREFIX_PATTERN, prefix):
            raise errors.InvalidArgument(
                f"prefix {prefix!r}: expected 1-32 letters, digits, _ . - (a letter or digit first)"
            )
        keep_for = merged.get("keep_for_s")
        if isinstance(keep_for, str) and keep_for.strip():
            try:
                keep_for = round(parse_duration(keep_for))
            except ValueError as exc:
                raise errors.InvalidArgument(f"keep_for_s: {exc}") from None
        enabled = merged.get("enabled", True)
        if not isinstance(enabled, bool):
            raise errors.InvalidArgument(f"enabled {enabled!r}: expected true or false")
        return {
            "path": self._dataset_path(merged.get("path")),
            "frequency": frequency,
            "interval_s": interval,
            "offset_s": parse_at(frequency, at),
            "prefix": prefix,
            "keep_last": _optional_int("keep_last", merged.get("keep_last"), 1, KEEP_MAX),
            "keep_for_s": _optional_int("keep_for_s", keep_for, MIN_INTERVAL_S),
            "enabled": enabled,
        }

    # -- schedules ---------------------------------------------------------------------------
    def add(self, path: str, frequency: str, *, actor: str = "system", **fields) -> Schedule:
        """A new schedule; its first snapshot is at its next slot."""
        values = self._values({"path": path, "frequency": frequency, **fields})
        now_ns = self.clock()
        values["last_slot_s"] = latest_slot(
            values["frequency"], values["interval_s"], values["offset_s"], now_ns / 1e9
        )

        stored = {"created_ns": now_ns}
        return SCHEDULES_SERVICE.create(self.catalog, values, actor=actor, stored=stored)

    def update(self, schedule_id: int, *, actor: str = "system", **fields) -> Schedule:
        if not fields:
            raise errors.InvalidArgument(
                f"update of snapshot schedule {schedule_id}: no fields given "
                f"(expected some of {', '.join(UPDATABLE)})"
            )
        current = self.get(schedule_id)
        values = self._values(fields, current)
        if (values["frequency"], values["interval_s"], values["offset_s"]) != (
            current.frequency,
            current.interval_s,
            current.offset_s,
        ):
            # a new timetable starts at its next slot, as a new schedule does
            values["last_slot_s"] = max(
                current.last_slot_s,
                latest_slot(
                    values["frequency"],
                    values["interval_s"],
                    values["offset_s"],
                    self.clock() / 1e9,
                ),
            )

        return SCHEDULES_SERVICE.update(self.catalog, schedule_id, values, actor=actor)

    def delete(self, schedule_id: int, *, actor: str = "system") -> None:
        """Remove a schedule; the snapshots it took stay (delete them by name)."""
        SCHEDULES_SERVICE.delete(self.catalog, schedule_id, actor=actor)

    def list_schedules(self, path: str | None = None) -> list[Schedule]:
        where = None
        if path is not None:
            where = SCHEDULES.c.path == join_path(split_path(path, "dataset path"))
        return SCHEDULES_SERVICE.list(self.catalog, "path", "id", where=where)

    def get(self, schedule_id: int) -> Schedule:
        return SCHEDULES_SERVICE.get(self.catalog, schedule_id)

    def due(self) -> list[Schedule]:
        """Enabled schedules whose slot has come (the daemon then queues a job)."""
        now_s = self.clock() / 1e9
        return [s for s in self.list_schedules() if s.due(now_s)]

    def _schedules(self, schedule_id: int | None) -> list[Schedule]:
        if schedule_id is not None:
            return [self.get(schedule_id)]  # on demand a disabled schedule runs too
        return [s for s in self.list_schedules() if s.enabled]

    # -- planning ----------------------------------------------------------------------------
    def taken(self, schedule: Schedule) -> list[SnapshotInfo]:
        """The snapshots of the schedule's dataset that it names, oldest first."""
        pattern = name_pattern(schedule.prefix)
        return sorted(
            (s for s in self.snapshots.list(schedule.path) if pattern.fullmatch(s.name)),
            key=lambda s: s.name,
        )

    def _plan(self, schedule: Schedule, now_ns: int) -> tuple[list[PlannedSnapshotAction], int]:
        """(actions, the schedule's newest slot once they are done)."""
        now_s = now_ns / 1e9
        slot = latest_slot(schedule.frequency, schedule.interval_s, schedule.offset_s, now_s)
        try:
            taken = self.taken(schedule)
        except errors.FsError as exc:
            return [
                PlannedSnapshotAction(
                    schedule.id,
                    schedule.path,
                    "",
                    "skip",
                    f"the dataset cannot be read: {exc.strerror}",
                    now_ns,
                    0,
                )
            ], max(slot, schedule.last_slot_s)  # a failed slot is not retried until the next
        actions = []
        # (name, slot time, unique bytes), with the snapshot a run takes now; ages count from
        # the slot a name carries, so they do not depend on when a late daemon took it
        candidates = [(s.name, slot_of(s.name) * 10**9, s.unique_bytes) for s in taken]
        held = {s.name for s in taken}
        if slot > schedule.last_slot_s:
            name = snapshot_name(schedule.prefix, slot)
            if name not in {s.name for s in taken}:
                actions.append(
                    PlannedSnapshotAction(
                        schedule.id,
                        schedule.path,
                        name,
                        "create",
                        f"the {schedule.frequency} slot of "
                        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(slot))} has come",
                        slot * 10**9,
                        0,
                    )
                )
                candidates.append((name, slot * 10**9, 0))
        else:
            slot = schedule.last_slot_s
        candidates.sort(key=lambda c: c[0], reverse=True)
        if schedule.keep_last is None and schedule.keep_for_s is None:
            return actions, slot
        deletions = []
        for rank, (name, created, unique) in enumerate(candidates, start=1):
            age_s = (now_ns - created) / 1e9
            by_count = schedule.keep_last is not None and rank <= schedule.keep_last
            by_age = schedule.keep_for_s is not None and age_s < schedule.keep_for_s
            if by_count or by_age:
                continue
            if name in held:  # what it frees, counted now (the stored figure ages)
                unique = self.snapshots.space_of(schedule.path, name).unique_bytes
            deletions.append(
                PlannedSnapshotAction(
                    schedule.id,
                    schedule.path,
                    name,
                    "delete",
                    f"number {rank} of {len(candidates)}, {format_duration(age_s)} old; "
                    f"schedule {schedule.id} keeps {schedule.keeps()}; "
                    f"frees {format_size(unique)}",
                    created,
                    unique,
                )
            )
        return actions + sorted(deletions, key=lambda d: d.name), slot  # oldest first

    def preview(self, schedule_id: int | None = None) -> list[PlannedSnapshotAction]:
        """Exactly what ``run`` would do now, changing nothing."""
        now_ns = self.clock()
        planned = []
        for schedule in self._schedules(schedule_id):
            planned += self._plan(schedule, now_ns)[0]
        return planned

    # -- running -----------------------------------------------------------------------------
    def run(
        self,
        schedule_id: int | None = None,
        *,
        actor: str = "system",
        progress: Progress | None = None,
    ) -> list[PlannedSnapshotAction]:
        """Take the due snapshots and delete those past their schedule's keep rules (one
        schedule, even a disabled one, or every enabled one); returns each action done."""
        with self._run_lock:
            now_ns = self.clock()
            plans = []
            for schedule in self._schedules(schedule_id):
                actions, slot = self._plan(schedule, now_ns)
                plans.append((schedule, actions, slot))
            total = sum(len(actions) for _s, actions, _slot in plans)
            results: list[PlannedSnapshotAction] = []
            for schedule, actions, slot in plans:
                failed: str | None = None
                for item in actions:
                    if progress:
                        progress(len(results), total, f"{item.action} {item.path}@{item.name}")
                    if failed is not None:
                        # the new snapshot was counted among those kept: keep the old ones too
                        results.append(replace(item, outcome=f"skipped: {failed}"))
                        continue
                    done = self._apply(item)
                    if item.action in ("create", "skip") and done.outcome != "done":
                        failed = f"the snapshot of this run was not taken ({done.outcome})"
                    results.append(done)
                self._finish(schedule, actions, results, slot, now_ns, actor)
            if progress:
                progress(total, total, "snapshot schedules done")
            return results

    def _apply(self, item: PlannedSnapshotAction) -> PlannedSnapshotAction:
        if item.action == "skip":
            return replace(item, outcome="failed: " + item.reason)
        try:
            if item.action == "create":
                self.snapshots.create(item.path, item.name)
            else:
                self.snapshots.delete(item.path, item.name)
        except errors.Exists:
            return replace(item, outcome="done")  # taken already (a run cut short after it)
        except errors.NotFound as exc:
            if item.action == "delete":
                return replace(item, outcome=f"skipped: gone since planning ({exc.strerror})")
            return replace(item, outcome=f"failed: {exc.strerror}")
        except errors.FsError as exc:
            return replace(item, outcome=f"failed: {exc.strerror}")
        return replace(item, outcome="done")

    def _finish(self, schedule, actions, results, slot, now_ns, actor) -> None:
        mine = [r for r in results if r.schedule_id == schedule.id]
        created = [r for r in mine if r.action == "create" and r.outcome == "done"]
        deleted = [r for r in mine if r.action == "delete" and r.outcome == "done"]
        errs = [r.outcome for r in mine if r.outcome and r.outcome.startswith("failed")]
        # a slot that failed is not tried again (the next slot is): the error stays shown
        values = {"last_run_ns": now_ns, "last_error": errs[0][:500] if errs else None}
        values["last_slot_s"] = slot

        def work(conn):
            conn.execute(SCHEDULES.update().where(SCHEDULES.c.id == schedule.id).values(**values))
            if not actions:
                return
            record_in(
                conn,
                "snapshot.schedule.run",
                f"snapshot schedule {schedule.id} of {schedule.path}: "
                f"{len(created)} taken, {len(deleted)} deleted" + (f"; {errs[0]}" if errs else ""),
                actor=actor,
                severity="warning" if errs else "info",
                details={
                    "schedule_id": schedule.id,
                    "created": [r.name for r in created],
                    "deleted": [r.name for r in deleted],
                },
            )

        self.catalog.run(work)


def plan_to_text(items: list[PlannedSnapshotAction]) -> str:
    """Plain table for the CLI's ``snapshot prune --dry-run``."""
    if not items:
        return "nothing to do"
    lines = []
    for item in items:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(item.created_ns // 10**9))
        tail = f"  [{item.outcome}]" if item.outcome else ""
        lines.append(
            f"schedule {item.schedule_id:<4} {item.action:<6} {when}  {item.path}@{item.name}  "
            f"({item.reason}){tail}"
        )
    return "\n".join(lines)
