"""`shingle snapshot create|list|delete|reclaim|rollback|clone|diff|schedule|prune|archive`:
versioned datasets from a terminal.

Snapshots change catalog rows only (a frozen copy of a tree's rows sharing its stripes; freed
stripes leave their zones to the data path's reclaim), so these commands work on the catalog
directly, whether or not a daemon runs: their transactions are not tracked ones, so the
daemon's caches (attributes, names, read-only ranges, settled sizes) read the catalog again at
their next use. A snapshot holds what was committed when it was taken.

Schedules are catalog rows too; ``prune`` (a schedule run: the due snapshots, then the
deletions its keep rules ask for) and ``archive`` (moves data to the cold tier) run where the
drives are owned: in the daemon as a job when it runs, else here (appliance/cli/lifecycle.py
``run_data_job``). ``prune --dry-run`` only shows what a run would do. ``delete`` returns at
once; the deleted snapshot's rows are freed by the daemon's paced ``snapshot-reclaim`` job (or
by ``reclaim``, the same job run now)."""

from __future__ import annotations

import argparse
import json
import time

from appliance.cli.common import UsageError, load_config
from appliance.config import format_size
from appliance.runtime import Appliance
from engine.base import errors
from engine.base.units import parse_duration
from engine.snapshots.schedules import FREQUENCIES, SnapshotScheduler, plan_to_text
from engine.snapshots.service import Snapshots


def _with_snapshots(args, work):
    appliance = Appliance(load_config(args), with_data=False)
    try:
        return work(Snapshots(appliance.namespace))
    finally:
        appliance.close()


def _when(ns: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ns / 1e9))


def _with_scheduler(args, work):
    appliance = Appliance(load_config(args), with_data=False)
    try:
        return work(SnapshotScheduler(appliance.namespace))
    finally:
        appliance.close()


def _duration(text: str) -> int:
    try:
        return round(parse_duration(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _keep_last(text: str) -> int | str:
    if text.strip().lower() == "none":
        return "none"  # set --keep-last none: no count rule any more
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number or none")
    return int(text)


def _schedule_fields(args) -> dict:
    """Fields of ``schedule add|set`` that were given."""
    fields: dict = {}
    frequency = getattr(args, "frequency", None)
    if frequency is not None:
        if frequency in FREQUENCIES and frequency != "interval":
            fields["frequency"] = frequency
        else:
            fields.update(frequency="interval", interval_s=_duration(frequency))
    for name in ("at", "prefix", "keep_last"):
        value = getattr(args, name, None)
        if value is not None:
            fields[name] = value
    if args.keep_for is not None:
        fields["keep_for_s"] = None if args.keep_for.lower() == "none" else _duration(args.keep_for)
    if args.enabled is not None:
        fields["enabled"] = args.enabled
    if fields.get("keep_last") == "none":
        fields["keep_last"] = None
    return fields


def _print_schedules(schedules, as_json: bool) -> None:
    if as_json:
        print(json.dumps([s.to_dict() for s in schedules], indent=2))
        return
    if not schedules:
        print("no snapshot schedules")
    for s in schedules:
        state = "" if s.enabled else " (disabled)"
        error = f"\n       last error: {s.last_error}" if s.last_error else ""
        print(
            f"{s.id:>4} {s.path}  {s.prefix}-...  {s.describe()}{state}; next "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(s.next_slot_s(time.time())))}"
            f"{error}"
        )


def cmd_schedule(args) -> int:
    action = args.schedule_action
    if action == "add":
        fields = _schedule_fields(args)
        made = _with_scheduler(
            args, lambda s: s.add(args.path, fields.pop("frequency"), actor="cli", **fields)
        )
        print(f"schedule {made.id}: {made.path} {made.describe()}, named {made.prefix}-TIME")
    elif action == "list":
        _print_schedules(_with_scheduler(args, lambda s: s.list_schedules(args.path)), args.json)
    elif action == "set":
        fields = _schedule_fields(args)
        if not fields:
            raise UsageError("snapshot schedule set ID with at least one option to change")
        made = _with_scheduler(args, lambda s: s.update(args.id, actor="cli", **fields))
        print(f"schedule {made.id}: {made.path} {made.describe()}")
    elif action == "remove":
        _with_scheduler(args, lambda s: s.delete(args.id, actor="cli"))
        print(f"schedule {args.id} removed (the snapshots it took stay)")
    return 0


def cmd_prune(args) -> int:
    if args.dry_run:
        plan = _with_scheduler(args, lambda s: s.preview(args.schedule))
        print(
            json.dumps([p.to_dict() for p in plan], indent=2) if args.json else plan_to_text(plan)
        )
        return 0
    from appliance.cli.lifecycle import finish_job, run_data_job

    job = run_data_job(args, "snapshot-schedule", {"schedule_id": args.schedule})
    return finish_job(job, args.json)


def cmd_archive(args) -> int:
    from appliance.cli.lifecycle import finish_job, run_data_job

    # a wrong name fails now, not in the daemon's job
    _with_snapshots(args, lambda s: _snapshot_named(s, args.path, args.name))
    job = run_data_job(args, "snapshot-archive", {"path": args.path, "name": args.name})
    return finish_job(job, args.json)


def cmd_reclaim(args) -> int:
    """Free deleted snapshots' rows now: in the daemon as its job when it runs, else here."""
    from appliance.cli.lifecycle import finish_job, run_data_job

    job = run_data_job(args, "snapshot-reclaim", {})
    return finish_job(job, args.json)


def _snapshot_named(snapshots: Snapshots, path: str, name: str):
    for info in snapshots.list(path):
        if info.name == name:
            return info
    raise errors.NotFound(f"no snapshot {name!r} of {path}")


def cmd_dataset(args) -> int:
    """`shingle dataset clone SNAPSHOT PATH`: the same clone as `snapshot clone`, named by the
    snapshot's path."""
    from engine.snapshots.datasets import clean_path, split_snapshot_path

    dataset, name = split_snapshot_path(args.snapshot)
    new_path = clean_path(args.new_path)
    _with_snapshots(args, lambda s: s.clone(dataset, name, new_path))
    print(f"{args.snapshot} cloned to {new_path} (writable; it shares every stripe)")
    return 0


def _print_list(args) -> None:
    snapshots = _with_snapshots(args, lambda s: s.list(args.path, recount=args.recount))
    if args.json:
        print(json.dumps([s.to_dict() for s in snapshots], indent=2))
        return
    for s in snapshots:
        print(
            f"{s.name:<24} {_when(s.created)}  referenced "
            f"{format_size(s.referenced_bytes):>10}  unique "
            f"{format_size(s.unique_bytes):>10}  shared {format_size(s.shared_bytes):>10}  "
            f"{s.files} inodes"
        )
    pending = _with_snapshots(args, lambda s: s.pending(args.path))
    if pending:
        counted = sum(p.pending_bytes or 0 for p in pending)
        print(
            f"pending: {len(pending)} deleted snapshot(s), {format_size(counted)} counted so "
            "far, not reclaimed yet"
        )


def cmd_snapshot(args) -> int:
    action = args.action
    if action == "schedule":
        return cmd_schedule(args)
    if action == "prune":
        return cmd_prune(args)
    if action == "archive":
        return cmd_archive(args)
    if action == "reclaim":
        return cmd_reclaim(args)
    if action == "create":
        info = _with_snapshots(args, lambda s: s.create(args.path, args.name))
        print(
            f"snapshot {info.name} of {args.path}: {info.files} inodes, "
            f"{format_size(info.referenced_bytes)} referenced"
        )
    elif action == "list":
        _print_list(args)
    elif action == "delete":
        _with_snapshots(args, lambda s: s.delete(args.path, args.name))
        print(
            f"deleted snapshot {args.name} of {args.path}: its space is reclaimed in the "
            "background by the daemon (pending in `snapshot list`; `snapshot reclaim` frees it "
            "now)"
        )
    elif action == "rollback":
        _with_snapshots(args, lambda s: s.rollback(args.path, args.name))
        print(f"{args.path} rolled back to snapshot {args.name}")
    elif action == "clone":
        _with_snapshots(args, lambda s: s.clone(args.path, args.name, args.new_path))
        print(f"snapshot {args.name} of {args.path} cloned to {args.new_path}")
    elif action == "diff":
        entries = _with_snapshots(args, lambda s: s.diff(args.path, args.a, args.b))
        if args.json:
            print(json.dumps([e.to_dict() for e in entries], indent=2))
        else:
            marks = {"added": "+", "removed": "-", "changed": "M"}
            for e in entries:
                print(f"{marks[e.change]} {e.path}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("snapshot", help="snapshots of a dataset (a directory tree)")
    actions = p.add_subparsers(dest="action", required=True)
    q = actions.add_parser("create", help="take a read-only snapshot, seen at PATH/.snapshots/NAME")
    q.add_argument("path")
    q.add_argument("name")
    q = actions.add_parser("list", help="snapshots of PATH with the space each holds")
    q.add_argument("path")
    q.add_argument(
        "--recount",
        action="store_true",
        help="count each snapshot's space now (else: as last counted by the daemon)",
    )
    q.add_argument("--json", action="store_true")
    q = actions.add_parser(
        "delete", help="remove a snapshot at once (what only it references is freed after)"
    )
    q.add_argument("path")
    q.add_argument("name")
    q = actions.add_parser(
        "reclaim",
        help="free deleted snapshots' space now (the daemon does it in the background, paced)",
    )
    q.add_argument("--json", action="store_true")
    q = actions.add_parser("rollback", help="make PATH what the snapshot holds")
    q.add_argument("path")
    q.add_argument("name")
    q = actions.add_parser("clone", help="a writable copy of a snapshot at NEWPATH")
    q.add_argument("path")
    q.add_argument("name")
    q.add_argument("new_path", metavar="NEWPATH")
    q = actions.add_parser("diff", help="paths added, changed, removed from A to B (or now)")
    q.add_argument("path")
    q.add_argument("a")
    q.add_argument("b", nargs="?")
    q.add_argument("--json", action="store_true")
    q = actions.add_parser(
        "schedule",
        help="periodic snapshots of a dataset, kept by --keep-last and --keep-for",
        description=SCHEDULE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    steps = q.add_subparsers(dest="schedule_action", required=True)
    add = steps.add_parser("add", help="a new schedule of PATH")
    add.add_argument("path")
    add.add_argument("frequency", metavar="hourly|daily|weekly|DURATION")
    change = steps.add_parser("set", help="change a schedule's options")
    change.add_argument("id", type=int)
    change.add_argument("--every", dest="frequency", metavar="hourly|daily|weekly|DURATION")
    for r in (add, change):
        r.add_argument("--at", help="hourly: minute (:15); daily: HH:MM UTC; weekly: 'Mon HH:MM'")
        r.add_argument("--keep-last", type=_keep_last, metavar="N", help="keep the newest N")
        r.add_argument("--keep-for", metavar="DURATION", help="keep those younger (e.g. 7d)")
        r.add_argument("--prefix", help="names are PREFIX-YYYY-MM-DDTHHMMZ (default auto)")
        r.add_argument("--disabled", dest="enabled", action="store_const", const=False)
        r.add_argument("--enabled", dest="enabled", action="store_const", const=True)
    r = steps.add_parser("list", help="the schedules (of PATH)")
    r.add_argument("path", nargs="?")
    r.add_argument("--json", action="store_true")
    r = steps.add_parser("remove", help="remove a schedule (its snapshots stay)")
    r.add_argument("id", type=int)
    q = actions.add_parser(
        "prune",
        help="run the schedules now: due snapshots, then deletions past their keep rules",
    )
    q.add_argument("--schedule", type=int, metavar="ID", help="one schedule (even disabled)")
    q.add_argument(
        "--dry-run", action="store_true", help="show what a run would do, change nothing"
    )
    q.add_argument("--json", action="store_true")
    q = actions.add_parser(
        "archive", help="move the stripes only this snapshot references to the cold tier"
    )
    q.add_argument("path")
    q.add_argument("name")
    q.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_snapshot)
    p = sub.add_parser("dataset", help="datasets: writable clones of their snapshots")
    actions = p.add_subparsers(dest="action", required=True)
    q = actions.add_parser(
        "clone",
        help="a writable copy of SNAPSHOT (DIR/.snapshots/NAME) at PATH, sharing its data",
    )
    q.add_argument("snapshot", metavar="SNAPSHOT")
    q.add_argument("new_path", metavar="PATH")
    p.set_defaults(func=cmd_dataset)


SCHEDULE_HELP = """\
Periodic snapshots of a dataset, named PREFIX-YYYY-MM-DDTHHMMZ after their slot (UTC), taken by
the daemon when their slot comes, and deleted when no keep rule keeps them any more: the
newest --keep-last N, and those younger than --keep-for (both: either keeps a snapshot;
neither: all stay). Snapshots with other names are never touched.

examples:
  shingle snapshot schedule add /datasets/web hourly --keep-last 24
  shingle snapshot schedule add /datasets/web daily --at 03:00 --keep-for 30d --prefix daily
  shingle snapshot schedule add /datasets/web 6h --keep-last 4 --prefix q
  shingle snapshot schedule set 2 --keep-last 10 --keep-for none
  shingle snapshot prune --dry-run
  shingle snapshot schedule remove 2"""
