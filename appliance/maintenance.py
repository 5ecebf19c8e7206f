"""Maintenance inside the daemon: scheduled work, queued jobs, metric samples.

Why inside the daemon and not a systemd timer: retention, tiering, cleaning,
scrub and rebuild move data, and only the daemon owns the drives (its write
scheduler, open bands and extent caches). A second process touching zones
would race it. So the daemon runs one maintenance thread that
- queues the scheduled jobs when their interval (config [maintenance]) is due,
- runs queued jobs one at a time (admins queue them from the CLI or web UI), with a
  heartbeat while each runs; at start, jobs a dead daemon left running are queued
  again or marked interrupted (engine.admin.jobs.recover_interrupted),
- records the counters of the NFS server and the data path every few seconds
  for the web UI's charts,
- looks at every drive (``maintenance.drive_check_interval_s``): a folder or device gone
  makes the drive ``missing``, one that came back is taken back (engine/datapath/drivewatch.py;
  I/O errors are noticed at once by the data path itself, even while a long job runs here),
- queues a ``snapshot-schedule`` job when a snapshot schedule's slot has come
  (engine/snapshots/schedules.py; one at a time, the job takes every due snapshot), and a
  ``snapshot-reclaim`` job when deleted snapshots wait for their rows to be freed (paced), and
  a ``snapshot-space`` job when snapshots' stored space figures are older than
  ``snapshots.space_recount_s``,
- evaluates the alert sources (engine/admin/alerts.py) every ``alerts.interval_s`` and hands raised
  and cleared alerts to the delivery threads (engine/admin/notify.py: queued, never waited for).

In a cluster ([cluster] etcd_endpoints), one host is the maintenance leader (an etcd lease:
engine/cluster/leader.py): only it queues scheduled jobs and runs queued ones, each write fenced
by its token (``Catalog.fenced``), and it recovers the jobs its predecessor left running when it
takes office. Every host checks its own drives, evaluates alerts and samples its counters.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from engine.admin import jobs
from engine.admin.metrics import record_sample
from engine.catalog import CatalogUnreachable, from_outage
from engine.catalog.fence import LeaderFenced
from engine.cluster.leader import FencedLeader
from engine.lifecycle.hostops import queue_gone_hosts, queue_rebuild_after_returns
from engine.snapshots.schedules import SnapshotScheduler
from engine.snapshots.service import Snapshots

log = logging.getLogger("shingle.maintenance")
T = TypeVar("T")

SCHEDULE = (  # job kind -> config key of its interval
    ("retention", "maintenance.retention_interval_s"),
    ("tier", "maintenance.tier_interval_s"),
    ("clean", "maintenance.clean_interval_s"),
    ("scrub", "maintenance.scrub_interval_s"),
    ("trash-purge", "maintenance.trash_purge_interval_s"),
)
LAST_RUN_KEY = "maintenance.last_queued.{kind}"


SINGLE_HOST = 0  # the term of a host without [cluster]: always leading, never fenced


class Maintenance(threading.Thread):
    def __init__(
        self,
        appliance,
        *,
        counters: Callable[[], dict] | None = None,
        tick_s: float = 1.0,
        sample_every_s: float = 10.0,
        leader: FencedLeader | None = None,
        runs_jobs: bool = True,
    ):
        """``leader``: this host's campaign in a cluster (``maintenance_leader``); jobs then run
        only while it holds office, fenced by its token. None: one host, jobs run here unless
        ``runs_jobs`` is False (a head other than head 0 of several sharing the drives)."""
        super().__init__(name="maintenance", daemon=True)
        self.appliance = appliance
        self.catalog = appliance.catalog
        self.counters = counters
        self.tick_s = tick_s
        self.sample_every_s = sample_every_s
        self.leader = leader
        self.runs_jobs = runs_jobs
        self.stopped = threading.Event()
        self.runners = job_runners(appliance)
        self.snapshot_scheduler = SnapshotScheduler(appliance.namespace)
        self.snapshots = Snapshots(appliance.namespace)
        self.alerts, self.notifier = alert_monitor(appliance.config, self.catalog)
        # a job's end the catalog did not take (an outage): written before anything else
        self._unfinished: Callable[[], object] | None = None

    def run(self) -> None:
        if self.leader is not None:
            self.leader.start()
        last_sample = last_drive_check = last_alerts = 0.0
        recovered: int | None = None  # the term whose interrupted jobs were recovered
        while not self.stopped.is_set():
            term = self.term()
            try:
                # at start (in a cluster: each new term), and again each round until the catalog
                # answers: no job runs before
                if term is not None and recovered != term:
                    self._unfinished = None  # a job of an earlier term: recovered with the others
                    if not self.in_term(term, self.recover_interrupted):
                        self.stopped.wait(self.tick_s)
                        continue
                    recovered = term
                if term is not None:
                    self.in_term(term, self.finish_pending)
                if self.drive_check_due(last_drive_check):
                    last_drive_check = time.monotonic()
                    self.appliance.datapath.check_drives()
                if self.alerts is not None and self.alerts_due(last_alerts):
                    last_alerts = time.monotonic()
                    self.alerts.tick()
                if term is not None and self.in_term(term, self.lead):
                    continue
                if self.counters and time.monotonic() - last_sample >= self.sample_every_s:
                    record_sample(self.catalog, **self.counters())
                    last_sample = time.monotonic()
            except CatalogUnreachable:
                pass  # the catalog's outage log counts it with every other thread's failures
            except LeaderFenced as exc:
                self._unfinished = None  # the successor recovers the job
                log.warning("maintenance: no longer the leader, work left to the next: %s", exc)
                if self.leader is not None:
                    self.leader.step_down(f"the catalog fenced this host: {exc}")
            except Exception:  # the loop must survive anything one round does
                log.exception("maintenance round failed")
            self.stopped.wait(self.tick_s)

    def term(self) -> int | None:
        """SINGLE_HOST without a cluster; in one, this host's fencing token while it leads, else
        None (another host runs the jobs)."""
        if self.leader is None:
            return SINGLE_HOST if self.runs_jobs else None
        return self.leader.token

    def in_term(self, term: int, work: Callable[[], T]) -> T:
        """``work()``, its catalog writes fenced by ``term`` in a cluster."""
        leader = self.leader
        if term == SINGLE_HOST or leader is None:
            return work()
        with self.catalog.fenced(term, lambda: leader.token == term):
            return work()

    def lead(self) -> bool:
        """The leader's part of a round: scheduled jobs queued, the next queued job run; True
        when one ran (the next round starts at once)."""
        self.queue_due_jobs()
        self.queue_due_snapshots()
        queue_gone_hosts(self.catalog, self.appliance.config.get("cluster.host_gone_after_s"))
        queue_rebuild_after_returns(self.catalog)
        self.queue_snapshot_reclaim()
        self.queue_snapshot_space()
        job = jobs.claim_next(self.catalog)
        if job is None:
            return False
        self.run_job(job)
        return True

    def alerts_due(self, last: float) -> bool:
        return time.monotonic() - last >= self.appliance.config.get("alerts.interval_s")

    def drive_check_due(self, last: float) -> bool:
        interval = self.appliance.config.get("maintenance.drive_check_interval_s")
        if not interval or getattr(self.appliance, "datapath", None) is None:
            return False
        return time.monotonic() - last >= interval

    def recover_interrupted(self) -> bool:
        """Jobs left running by a daemon that died (this one holds the lock, so none runs);
        False when the catalog did not answer (the loop tries again next round)."""
        try:
            for job in jobs.recover_interrupted(self.catalog):
                log.warning(
                    "job %d (%s) was interrupted by a daemon stop: %s", job.id, job.kind, job.state
                )
        except CatalogUnreachable:
            return False  # counted by the catalog's outage log
        except LeaderFenced:
            raise  # the round's end steps down
        except Exception:
            log.exception("could not recover interrupted jobs")
        return True

    def queue_due_jobs(self) -> None:
        now = time.time()
        for kind, key in SCHEDULE:
            interval = self.appliance.config.get(key)
            if not interval or kind not in self.runners:
                continue
            setting = LAST_RUN_KEY.format(kind=kind)
            last = self.catalog.get_setting(setting)
            if last is None:  # a new appliance: the first round comes one interval from now
                self.catalog.set_setting(setting, str(now))
            elif now - float(last) >= interval:
                self.catalog.set_setting(setting, str(now))
                jobs.submit(self.catalog, kind, {"scheduled": True}, actor="schedule")

    def queue_due_snapshots(self) -> None:
        """A snapshot-schedule job when a schedule is due and none is queued or running."""
        if not self.snapshot_scheduler.due():
            return
        if not jobs.pending(self.catalog, "snapshot-schedule"):
            jobs.submit(self.catalog, "snapshot-schedule", {"scheduled": True}, actor="schedule")

    def queue_snapshot_reclaim(self) -> None:
        """A snapshot-reclaim job when deleted snapshots wait for their rows to be freed and
        none is queued or running."""
        if "snapshot-reclaim" not in self.runners or not self.snapshots.pending():
            return
        if not jobs.pending(self.catalog, "snapshot-reclaim"):
            jobs.submit(self.catalog, "snapshot-reclaim", {"scheduled": True}, actor="schedule")

    def queue_snapshot_space(self) -> None:
        """A snapshot-space job when some snapshot's stored space figures are older than
        ``snapshots.space_recount_s`` and none is queued or running."""
        interval = self.appliance.config.get("snapshots.space_recount_s")
        if not interval or "snapshot-space" not in self.runners:
            return
        if self.snapshots.space_due(interval) and not jobs.pending(self.catalog, "snapshot-space"):
            jobs.submit(self.catalog, "snapshot-space", {"scheduled": True}, actor="schedule")

    def finish_job(self, job_id: int, **outcome) -> None:
        """Record a job's end; if the catalog is unreachable, at the start of every round until it
        takes it (else the job would stay running until the daemon restarts)."""
        self._unfinished = functools.partial(jobs.finish, self.catalog, job_id, **outcome)
        self.finish_pending()

    def finish_pending(self) -> None:
        if self._unfinished is not None:
            self._unfinished()  # CatalogUnreachable: still pending; the round ends here
            self._unfinished = None

    def run_job(self, job: jobs.JobRecord) -> None:
        runner = self.runners.get(job.kind)
        if runner is None:
            self.finish_job(job.id, ok=False, message=f"this build cannot run {job.kind} jobs")
            return
        log.info("job %d (%s) started by %s", job.id, job.kind, job.actor)
        try:
            with jobs.Heartbeat(self.catalog, job.id):
                result = runner(job.params, jobs.progress_writer(self.catalog, job.id), job.actor)
        except LeaderFenced:
            raise  # the job stays running: the successor queues it again
        except Exception as exc:
            if from_outage(exc):  # the catalog went away: its outage log tells why
                log.error("job %d (%s) failed: %s", job.id, job.kind, exc)
            else:
                log.exception("job %d (%s) failed", job.id, job.kind)
            self.finish_job(job.id, ok=False, message=f"{exc.__class__.__name__}: {exc}")
            return
        warnings = result.get("warnings") if isinstance(result, dict) else None
        if warnings:
            log.warning("job %d (%s) done with warnings: %s", job.id, job.kind, "; ".join(warnings))
        else:
            log.info("job %d (%s) done", job.id, job.kind)
        self.finish_job(job.id, ok=True, result=result, warnings=warnings)

    def stop(self) -> None:
        self.stopped.set()
        if self.leader is not None:
            self.leader.stop(resign=True)  # the successor need not wait for the lease to expire
        if self.notifier is not None:
            self.notifier.stop()


def alert_settings(config, catalog=None):
    """The engine's AlertSettings from ``[alerts]`` and the web UI's certificate."""
    from appliance.smb.samba import SambaLayout
    from engine.admin.alerts import AlertSettings

    cert = config.get("webui.tls_cert_file")
    return AlertSettings(
        capacity_warn_percent=config.get("alerts.capacity_warn_percent"),
        capacity_critical_percent=config.get("alerts.capacity_critical_percent"),
        temperature_c=config.get("alerts.temperature_c"),
        cert_file=str(config.resolve("webui.tls_cert_file")) if cert else "",
        cert_warn_days=config.get("alerts.cert_warn_days"),
        smartctl=config.get("smart.smartctl"),
        policies=config.policies(),
        reserve_zones=config.get("storage.reserve_zones"),
        smb_problem_file=str(SambaLayout.for_data_dir(config.data_dir).problem_file),
    )


def alert_monitor(config, catalog):
    """(AlertMonitor, Notifier or None), or (None, None) when alerts.interval_s is 0."""
    from engine.admin.alerts import AlertMonitor
    from engine.admin.notify import Notifier, sinks_from_config

    if not config.get("alerts.interval_s"):
        return None, None
    sinks = sinks_from_config(config.get, config.resolve)
    notifier = Notifier(sinks) if sinks else None
    monitor = AlertMonitor(
        catalog, alert_settings(config), deliver=notifier.deliver if notifier else None
    )
    return monitor, notifier


def job_runners(appliance) -> dict[str, Callable]:
    """kind -> runner(params, progress, actor) -> JSON-able result."""
    from engine.admin.trash import Trash
    from engine.snapshots.retention import RetentionService

    ns, catalog = appliance.namespace, appliance.catalog
    retention = RetentionService(ns, catalog)
    trash = Trash(ns, catalog)

    def run_retention(params, progress, actor):
        done = retention.run(params.get("rule_id"), actor=actor, progress=progress)
        return [item.to_dict() for item in done]

    def run_trash_purge(params, progress, actor):
        if params.get("entry") is not None:  # one entry (the web UI's trash page), now
            entry = trash.find(int(params["entry"]))
            trash.delete(
                entry.trash_path,
                actor,
                event_kind="trash.purge",
                details={"original_path": entry.original_path},
                expect_ino=entry.id,
            )
            return [entry.to_dict()]
        return [
            item.to_dict()
            for item in trash.purge(params.get("older_than_s"), actor=actor, progress=progress)
        ]

    runners = {"retention": run_retention, "trash-purge": run_trash_purge}
    runners.update(snapshot_runners(appliance))
    runners.update(lifecycle_runners(appliance))
    return runners


def snapshot_runners(appliance) -> dict[str, Callable]:
    """Scheduled snapshots and their retention; archiving a snapshot (with a data path)."""
    from engine.snapshots.archive import archive_snapshot

    ns = appliance.namespace
    scheduler = SnapshotScheduler(ns)

    def run_schedules(params, progress, actor):
        done = scheduler.run(params.get("schedule_id"), actor=actor, progress=progress)
        failed = [
            f"{d.path}@{d.name}: {d.outcome}"
            for d in done
            if d.outcome and d.outcome.startswith("failed")
        ]
        return {"actions": [d.to_dict() for d in done], "warnings": failed}

    def run_space(params, progress, actor):
        interval = appliance.config.get("snapshots.space_recount_s") or None
        counted = Snapshots(ns).recount_space(older_than_s=interval, progress=progress)
        return {"snapshots_counted": counted}

    runners: dict[str, Callable] = {"snapshot-schedule": run_schedules, "snapshot-space": run_space}
    if appliance.datapath is not None:

        def run_archive(params, progress, actor):
            report = archive_snapshot(
                ns,
                appliance.datapath,
                params["path"],
                params["name"],
                progress=progress,
                actor=actor,
            )
            return report.to_dict()

        runners["snapshot-archive"] = run_archive

        def run_reclaim(params, progress, actor):
            pace = appliance.config.get("snapshots.reclaim_inodes_per_s")
            freed = Snapshots(ns).reclaim(inodes_per_s=pace, progress=progress)
            return {"stripes_freed": freed}

        runners["snapshot-reclaim"] = run_reclaim
    return runners


def lifecycle_runners(appliance) -> dict[str, Callable]:
    """Runners for the data-moving jobs: tier, clean, scrub, rebuild, drain."""
    if appliance.datapath is None:
        return {}
    from engine.lifecycle.jobs import runners

    scrub_rate = appliance.config.get("maintenance.scrub_mib_s") * (1 << 20)
    rebuild_rate = appliance.config.get("maintenance.rebuild_mib_s") * (1 << 20)
    return runners(
        appliance.namespace,
        appliance.datapath,
        appliance.catalog,
        reads=appliance.reads,
        scrub_bytes_per_s=scrub_rate,
        rebuild_bytes_per_s=rebuild_rate or None,
    )


def maintenance_leader(config, catalog) -> FencedLeader | None:
    """This host's campaign for the maintenance leader ([cluster] etcd_endpoints set), raising
    the catalog's fence when it takes office; None on a single host."""
    from appliance.config import etcd_client, etcd_endpoints
    from engine.catalog import fence

    endpoints = etcd_endpoints(config.get("cluster.etcd_endpoints"))
    if not endpoints:
        return None
    ttl_s = config.get("cluster.lease_ttl_s")
    leader = FencedLeader(
        # a request must leave the lease time to be renewed by another endpoint
        etcd_client(config, timeout_s=min(2.0, ttl_s / 3)),
        config.get("cluster.name") or None,
        ttl_s=ttl_s,
    )
    leader.on_elected = lambda token: fence.advance(catalog, token, leader.name)
    return leader
