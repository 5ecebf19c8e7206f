"""`shingle retention|trash|drives|jobs|rebuild|scrub|tier|clean`: lifecycle from a terminal.

Rules, listings and drive states are catalog changes, done directly. Work
that moves data runs where the drives are owned: in this process when no
daemon runs (it takes the daemon lock), else as a job the daemon runs while
this command shows its progress."""

from __future__ import annotations

import json
import sys
import time

from appliance.cli.common import UsageError, load_config, size_arg
from appliance.daemonlock import DaemonLock
from appliance.runtime import Appliance, open_catalog
from engine.admin import jobs
from engine.base.units import format_duration, format_size, format_value

EXIT_WARNINGS = 4  # the job ran but ended "done with warnings" (e.g. stripes still under-protected)


class ProgressLine:
    """One updating line on a terminal; plain lines at most every 2 s otherwise."""

    def __init__(self, stream=sys.stderr):
        self.stream = stream
        self.tty = stream.isatty()
        self.started = time.monotonic()
        self.last = 0.0

    def __call__(self, done: int, total: int, message: str = "") -> None:
        now = time.monotonic()
        if not self.tty and now - self.last < 2 and done < total:
            return
        self.last = now
        fraction = done / total if total else 0.0
        elapsed = now - self.started
        # a job's own message (engine.lifecycle.pacing.Tracker) may carry its ETA already
        own_eta = 0 < fraction < 1 and "ETA" not in message
        eta = f", ETA {format_duration(elapsed / fraction - elapsed)}" if own_eta else ""
        bar = "#" * int(fraction * 30)
        line = f"[{bar:<30}] {fraction:6.1%} {message[:90]}{eta}"
        if self.tty:
            self.stream.write("\r\x1b[K" + line)
            if total and done >= total:
                self.stream.write("\n")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def show_job(self, job: jobs.JobRecord) -> None:
        self(job.done, job.total, job.message or job.state)


def load_config_as_owner(args):
    """The config, with this process running as the owner of its data from here on (root
    acting on an installed appliance: runtime.become_data_owner)."""
    from appliance.runtime import become_data_owner

    config = load_config(args)
    become_data_owner(config)
    return config


def run_data_job(args, kind: str, params: dict | None = None) -> jobs.JobRecord:
    """Run a data-moving job here if no daemon owns the drives, else through the daemon."""
    from appliance.maintenance import Maintenance

    config = load_config_as_owner(args)
    lock = DaemonLock(config.data_dir)
    progress = ProgressLine()
    # in a cluster the maintenance leader runs every job, wherever it is: queue it for it
    clustered = bool(config.get("cluster.etcd_endpoints"))
    if not clustered and lock.acquire():
        try:
            with Appliance(config) as appliance:
                maintenance = Maintenance(appliance)
                maintenance.recover_interrupted()  # we own the drives: no job runs now
                job_id = jobs.submit(appliance.catalog, kind, params, actor="cli")
                job = jobs.claim(appliance.catalog, job_id)
                assert job is not None  # just submitted, and we hold the daemon lock
                runner = maintenance.runners.get(kind)
                if runner is None:
                    jobs.finish(
                        appliance.catalog,
                        job_id,
                        ok=False,
                        message=f"this build cannot run {kind} jobs",
                    )
                else:
                    maintenance.run_job(job)
                return jobs.get(appliance.catalog, job_id)
        finally:
            lock.release()
    catalog = open_catalog(config)
    try:
        job_id = jobs.submit(catalog, kind, params, actor="cli")
        if clustered:
            print(f"queued job {job_id} for the cluster's maintenance leader", file=sys.stderr)
            return jobs.wait(catalog, job_id, progress=progress.show_job)
        print(
            f"the daemon (pid {lock.holder()}) owns the drives: queued job {job_id}",
            file=sys.stderr,
        )
        return jobs.wait(catalog, job_id, progress=progress.show_job, daemon_gone=lock.holder_gone)
    finally:
        catalog.close()


def finish_job(job: jobs.JobRecord, as_json: bool) -> int:
    if as_json:
        print(json.dumps(job.to_dict(), indent=2, default=str))
    else:
        print(
            f"{job.kind} job {job.id}: {job.state_label}"
            + (f" ({job.message})" if job.message else "")
        )
        if isinstance(job.result, list):
            for item in job.result:
                print(
                    "  "
                    + (
                        f"{item.get('action', '')} {item.get('path', '')} {item.get('outcome', '')}"
                        if isinstance(item, dict)
                        else str(item)
                    )
                )
        elif isinstance(job.result, dict):
            for key, value in job.result.items():
                print(f"  {key}: {format_value(key, value)}")
    return 0 if job.state == "done" else EXIT_WARNINGS if job.state == jobs.WARNINGS else 1


def with_catalog(args, work):
    config = load_config_as_owner(args)
    catalog = open_catalog(config)
    try:
        return work(config, catalog)
    finally:
        catalog.close()


def with_namespace(args, work):
    config = load_config_as_owner(args)
    appliance = Appliance(config, with_data=False)
    try:
        return work(appliance)
    finally:
        appliance.close()


# -- retention ----------------------------------------------------------------------
def cmd_retention(args) -> int:
    from engine.snapshots.retention import RetentionService, plan_to_text

    if args.action in ("run",):
        return finish_job(run_data_job(args, "retention", {"rule_id": args.rule}), args.json)

    def work(appliance):
        service = RetentionService(appliance.namespace, appliance.catalog)
        if args.action == "add":
            if not args.pattern or args.keep is None:
                raise UsageError("retention add PATTERN --keep N [--action delete|cold|trash]")
            rule_id = service.add_rule(
                args.pattern,
                args.keep,
                action=args.rule_action,
                order_by=args.order_by,
                actor="cli",
            )
            print(
                f"rule {rule_id}: keep the newest {args.keep} of {args.pattern}, "
                f"{args.rule_action} the rest"
            )
        elif args.action == "list":
            rules = service.list_rules()
            if args.json:
                print(json.dumps([r.to_dict() for r in rules], indent=2))
            for rule in [] if args.json else rules:
                print(
                    f"{rule.id:>4} keep {rule.keep:<4} {rule.action:<7} by {rule.order_by:<5} "
                    f"{'enabled ' if rule.enabled else 'disabled'} {rule.pattern}"
                )
        elif args.action == "preview":
            plan = service.preview(args.rule)
            print(
                json.dumps([p.to_dict() for p in plan], indent=2)
                if args.json
                else plan_to_text(plan)
            )
        elif args.action == "delete":
            if args.rule is None:
                raise UsageError("retention delete --rule ID")
            service.delete_rule(args.rule, actor="cli")
            print(f"rule {args.rule} deleted")
        return 0

    return with_namespace(args, work)


# -- trash --------------------------------------------------------------------------
def cmd_trash(args) -> int:
    from engine.admin.trash import Trash

    if args.action == "purge":
        return finish_job(
            run_data_job(args, "trash-purge", {"older_than_s": args.older_than}), args.json
        )

    def work(appliance):
        trash = Trash(appliance.namespace, appliance.catalog)
        if args.action == "list":
            entries = trash.list()
            if args.json:
                print(json.dumps([e.to_dict() for e in entries], indent=2))
            for entry in [] if args.json else entries:
                print(f"{entry.id:>8} {entry.trash_path}  (was {entry.original_path})")
        else:
            if not args.entry:
                raise UsageError("trash restore ID|PATH")
            target = args.entry if not args.entry.isdigit() else int(args.entry)
            print(f"restored to {trash.restore(target, actor='cli')}")
        return 0

    return with_namespace(args, work)


# -- drives ------------------------------------------------------------------------
def cmd_drives(args) -> int:
    from engine.lifecycle import drives

    if args.action == "drain":
        if args.drive is None:
            raise UsageError("drives drain ID")
        with_catalog(
            args, lambda config, catalog: drives.start_drain(catalog, args.drive, actor="cli")
        )
        return finish_job(run_data_job(args, "drain", {"drive": args.drive}), args.json)

    if args.action in ("add", "replace"):
        params = drive_job_params(args)
        outside = _outside_the_daemons_sandbox(args, params["path"])
        code = finish_job(run_data_job(args, f"drive-{args.action}", params), args.json)
        if outside and code != 1:
            print(
                f"{params['path']} lies outside the paths shingle-nfsd.service may write: run "
                "`shingle install` again (it adds a ReadWritePaths= drop-in for every drive), "
                "then `systemctl start shingle.target`",
                file=sys.stderr,
            )
        return code

    def work(config, catalog):
        if args.action == "list":
            from appliance.cli.status import add_device_errors, device_error_note

            found = [d.to_dict() for d in drives.list_drives(catalog)]
            add_device_errors(found, catalog)  # a zoned device's faults, as the daemon sampled
            if args.json:
                print(json.dumps(found, indent=2, default=str))
            for d in [] if args.json else found:
                print(
                    f"{d['id']:>4} {d['state']:<9} {format_size(d['capacity_bytes']):>10}  zones "
                    f"{d['zones_empty']} empty / {d['zones_open']} open / {d['zones_full']} full  "
                    f"live {format_size(d['live_bytes'])}  {d['path']}" + device_error_note(d)
                )
        elif args.action == "fail":
            if args.drive is None:
                raise UsageError("drives fail ID")
            drives.fail_drive(catalog, args.drive, actor="cli")
            print(f"drive {args.drive} marked failed; run `shingle rebuild` to restore redundancy")
        return 0

    return with_catalog(args, work)


def _outside_the_daemons_sandbox(args, path: str) -> bool:
    """Whether the installed daemon's unit may not write ``path`` (ProtectSystem=strict
    leaves only its ReadWritePaths= writable). With that daemon running the drive cannot be
    made: refuse before queueing a job it would fail."""
    from pathlib import Path

    from appliance.host import install

    config = load_config(args)
    if config.path is None or Path(config.path).resolve() != install.CONFIG_PATH:
        return False  # not the config the units serve
    granted = install.unit_writable_paths(Path("/"))
    if granted is None:
        return False  # no units installed
    target = Path(path).resolve()
    if any(target == g or g in target.parents for g in granted):
        return False
    from appliance.daemonlock import process_alive

    holder = DaemonLock(config.data_dir).holder_pid()
    if holder is not None and process_alive(holder):
        raise UsageError(
            f"{path}: the running daemon (pid {holder}) may write only "
            f"{', '.join(map(str, granted))} (its unit's ReadWritePaths=); add a drive under "
            f"{config.resolve('storage.drives_dir')}, or stop the appliance, add it, run "
            "`shingle install` again and start it"
        )
    return True


def drive_job_params(args) -> dict:
    """Params of a drive-add or drive-replace job: the new drive's path made absolute (the
    daemon runs elsewhere), its geometry (default: that of the drives in use)."""
    import os

    if args.action == "add":
        if not args.drive:
            raise UsageError("drives add PATH|DEVICE")
        path, params = args.drive, {}
    else:
        if not args.drive or not args.target:
            raise UsageError("drives replace OLD_ID PATH|DEVICE")
        path, params = args.target, {"old": args.drive}
    params.update(
        path=os.path.abspath(path),
        size=args.size,
        zone_size=args.zone_size,
        preallocate=args.preallocate,
    )
    return params


def cmd_jobs(args) -> int:
    def work(config, catalog):
        found = jobs.recent(catalog, args.limit)
        if args.json:
            print(json.dumps([j.to_dict() for j in found], indent=2, default=str))
        for job in [] if args.json else found:
            print(
                f"{job.id:>5} {job.kind:<13} {job.state_label:<8} {job.fraction:6.1%} "
                f"{job.actor:<10} {job.message or ''}"
            )
        return 0

    return with_catalog(args, work)


def cmd_data_job(kind: str):
    def run(args) -> int:
        return finish_job(run_data_job(args, kind, {}), args.json)

    return run


RETENTION_HELP = """\
Keep the newest N entries matching a path pattern in each parent folder, and delete,
move to the trash or send to cold storage the older ones. A preview shows exactly
what a run would do; entries open or changed in the last minutes are skipped.

actions:
  add PATTERN --keep N   a new rule (--action delete|cold|trash, --order-by mtime|name)
  list                   the rules
  preview [--rule ID]    what a run would do now, changing nothing
  run [--rule ID]        apply the rules (in the daemon when it runs)
  delete --rule ID       remove a rule

examples:
  shingle retention add '/checkpoints/*/step-*' --keep 3 --action trash
  shingle retention preview --rule 1
  shingle retention run --rule 1
  shingle retention list --json

"trash" keeps the bytes until the trash is purged; "delete" frees them at once."""

TRASH_HELP = """\
Entries moved to the trash (by retention rules with --action trash) wait in their
export's .trash folder, still taking space, until they are purged: by the daemon after
the export's trash_days, or now with purge.

actions:
  list                       entries with their trash path and original path
  restore ID|PATH            put one back where it was
  purge [--older-than S]     free the space of entries deleted S seconds ago or more
                             (without it: those past their export's trash_days;
                             --older-than 0 empties the trash)

examples:
  shingle trash list
  shingle trash restore 42
  shingle trash purge --older-than 604800     # a week"""

DRIVES_HELP = """\
The drives and their states (online, degraded, failed, draining, removed).

actions:
  list          every drive with its zones and live bytes
  fail ID       mark a drive failed (its data is then read from redundancy);
                run `shingle rebuild` to restore full redundancy
  drain ID      move a drive's data to the others, then retire it
  add PATH      a new drive: PATH a new folder (an emulated drive of zone files, the size
                of the drives in use unless --size/--zone-size; --no-preallocate) or a
                host-managed zoned block device whose sequential zones are empty (its
                geometry read from it); then rebuild onto it
  replace OLD PATH
                add PATH as above and retire drive OLD (drained if readable, rebuilt from
                redundancy if not), until no stripe is under-protected

Adding and replacing run in the daemon when it runs (it owns the drives). A job that ends
with stripes still under-protected ends "done with warnings" (exit code 4), saying why.

examples:
  shingle drives list
  shingle drives fail 3 && shingle rebuild
  shingle drives drain 7 --json
  shingle drives add /srv/shingle/drives/drive-010 --no-preallocate
  shingle drives replace 3 /dev/sdk"""


def register(sub) -> None:
    import argparse

    examples = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser(
        "retention",
        help="keep-last-N rules: add, list, preview, run, delete",
        description=RETENTION_HELP,
        formatter_class=examples,
    )
    p.add_argument("action", choices=["add", "list", "preview", "run", "delete"])
    p.add_argument("pattern", nargs="?", help="path pattern, e.g. '/checkpoints/*/step-*'")
    p.add_argument("--keep", type=int, help="how many of the newest entries to keep")
    p.add_argument(
        "--action",
        dest="rule_action",
        default="delete",
        choices=["delete", "cold", "trash"],
        help="what happens to the older entries (default delete)",
    )
    p.add_argument("--order-by", default="mtime", choices=["mtime", "name"])
    p.add_argument("--rule", type=int, help="one rule's id (preview/run/delete)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_retention)

    p = sub.add_parser(
        "trash",
        help="list, restore or purge deleted entries",
        description=TRASH_HELP,
        formatter_class=examples,
    )
    p.add_argument("action", choices=["list", "restore", "purge"])
    p.add_argument("entry", nargs="?", help="restore: the entry's id or trash path")
    p.add_argument(
        "--older-than", type=float, help="purge: seconds since deletion (0 empties the trash)"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_trash)

    p = sub.add_parser(
        "drives",
        help="list, add, replace, fail or drain drives",
        description=DRIVES_HELP,
        formatter_class=examples,
    )
    p.add_argument("action", choices=["list", "fail", "drain", "add", "replace"])
    p.add_argument("drive", nargs="?", help="drive id (add: the new drive's folder or device)")
    p.add_argument("target", nargs="?", help="replace: the new drive's folder or device")
    p.add_argument("--size", type=size_arg, help="add/replace: emulated drive size, e.g. 1GiB")
    p.add_argument("--zone-size", type=size_arg, help="add/replace: zone size, e.g. 64MiB")
    p.add_argument(
        "--no-preallocate",
        dest="preallocate",
        action="store_false",
        help="add/replace: zone files grow as written",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_drives)

    p = sub.add_parser("jobs", help="recent maintenance jobs and their progress")
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_jobs)

    for kind, text in (
        ("rebuild", "restore full redundancy after a drive failed"),
        ("scrub", "verify every fragment's checksum and repair from redundancy"),
    ):
        p = sub.add_parser(kind, help=text)
        p.add_argument("--json", action="store_true")
        p.set_defaults(func=cmd_data_job(kind))
    for kind, text in (
        ("tier", "move data between hot, warm and cold bands"),
        ("clean", "band cleaning: copy live data out of mostly-garbage bands, reset them"),
    ):
        p = sub.add_parser(kind, help=text)
        p.add_argument("action", choices=["run"])
        p.add_argument("--json", action="store_true")
        p.set_defaults(func=cmd_data_job(kind))
