"""Alerts: typed conditions an admin must hear about, kept in the catalog (table ``alerts``).

Each source (an ``AlertSource`` subclass, one per kind, as TrueNAS's alert/source/*.py) looks at
the catalog (or SMART, or a certificate) and returns ``Finding``s: which instance (``key``, e.g.
``drive:3``), how bad, and a message. ``AlertService.apply`` turns one evaluation of a kind into
state changes in one transaction:
- a finding with no open alert of its (kind, key) raises a new one: ``active``;
- an open alert (``active`` or ``acknowledged``) whose finding is gone becomes ``cleared``;
- an admin's ``acknowledge`` moves ``active`` to ``acknowledged`` (it stays open until cleared,
  so a known problem stops the banner but is not forgotten).
Raised and cleared alerts are returned as ``Notice``s for delivery (engine/admin/notify.py). The
daemon's maintenance loop runs ``AlertMonitor.tick`` (appliance/maintenance.py), each source at its
own interval. ``catalog_unreachable`` cannot be stored while the catalog is away: the monitor sends
it at once and records it, already cleared, once the catalog answers again."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import select, text

from engine.admin.events import record_in
from engine.base import errors
from engine.catalog.database import Catalog, CatalogUnreachable
from engine.catalog.models import Alert, Drive, Job

log = logging.getLogger("shingle.alerts")
ALERTS = Alert.__table__
DRIVES = Drive.__table__
JOBS = Job.__table__
ACTIVE, ACKNOWLEDGED, CLEARED = "active", "acknowledged", "cleared"
OPEN = (ACTIVE, ACKNOWLEDGED)
WARNING, CRITICAL = "warning", "critical"


@dataclass(frozen=True)
class Finding:
    key: str
    severity: str
    message: str
    details: dict = field(default_factory=dict)


@dataclass(frozen=True)
class AlertRecord:
    id: int
    kind: str
    key: str
    severity: str
    state: str
    message: str
    details: dict
    first_ns: int
    last_ns: int
    acknowledged_ns: int | None
    acknowledged_by: str | None
    cleared_ns: int | None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Notice:
    """What delivery sends: an alert that was raised ("active") or "cleared"."""

    alert: AlertRecord
    change: str  # "active" | "cleared"

    def to_dict(self) -> dict:
        return {"change": self.change, **self.alert.to_dict()}

    @property
    def subject(self) -> str:
        word = "CLEARED" if self.change == CLEARED else self.alert.severity.upper()
        return f"[shingle {word}] {self.alert.message}"[:200]


def _record(row) -> AlertRecord:
    return AlertRecord(
        row.id,
        row.kind,
        row.key,
        row.severity,
        row.state,
        row.message,
        json.loads(row.details) if row.details else {},
        row.first_ns,
        row.last_ns,
        row.acknowledged_ns,
        row.acknowledged_by,
        row.cleared_ns,
    )


# -- settings the sources read -----------------------------------------------------------------
@dataclass
class AlertSettings:
    capacity_warn_percent: float = 80.0
    capacity_critical_percent: float = 90.0
    temperature_c: float = 55.0
    cert_file: str = ""  # the web UI's TLS certificate ([webui] tls_cert_file), "" for none
    cert_warn_days: float = 21.0
    smartctl: str = "/usr/sbin/smartctl"
    policies: dict = field(default_factory=dict)  # band class policies, for capacity
    reserve_zones: int = 2
    # why SMB cannot serve, as the SMB service writes it ({"problem": text}); "" for none
    smb_problem_file: str = ""


class AlertSource:
    kind = ""
    interval_s = 0.0  # at least this long between evaluations (0: at every tick of the monitor)

    def find(self, catalog: Catalog, settings: AlertSettings) -> list[Finding]:
        raise NotImplementedError


class DriveFailed(AlertSource):
    """A drive failed (by an admin or a rebuild) or missing (its folder or device is gone).
    The drives of a host lost as a whole are left to HostLost: one alert per host."""

    kind = "drive_failed"

    def find(self, catalog, settings):
        from engine.lifecycle.hosts import host_states_in

        def work(conn):
            lost = {
                drive_id
                for host in host_states_in(conn).values()
                if host["state"] == "lost"
                for drive_id in host["drives"]
            }
            rows = conn.execute(
                select(DRIVES.c.id, DRIVES.c.state, DRIVES.c.path).where(
                    DRIVES.c.state.in_(("failed", "missing"))
                )
            ).all()
            return [r for r in rows if r.id not in lost]

        rows = catalog.read(work)
        return [
            Finding(
                f"drive:{r.id}",
                CRITICAL,
                f"drive {r.id} is {r.state} ({r.path}): replace it (`shingle drives replace`)",
                {"drive_id": r.id, "state": r.state},
            )
            for r in rows
        ]


class HostLost(AlertSource):
    """An agent's host that does not answer (every drive of it missing: killed, powered off,
    its link down), or declared gone for good while its fragments are rebuilt elsewhere: one
    alert per host (key ``host:NAME``), however many drives and heads saw it, cleared when it
    answers again or once it is out of the pool."""

    kind = "host_lost"

    def find(self, catalog, settings):
        from engine.lifecycle.hosts import host_states_in

        found = []
        for name, host in catalog.read(host_states_in).items():
            if host["state"] != "lost":
                continue
            drives = len(host["drives"])
            if host["answers"] is False:
                severity = CRITICAL
                message = (
                    f"host {name} does not answer (its agent at {host['address']}; {drives} "
                    "drives): reads decode from the other hosts; if it is gone for good, "
                    f"`shingle cluster remove {name}` rebuilds its fragments on the others"
                )
            else:
                severity = WARNING
                message = (
                    f"host {name} is gone for good: its {drives} drives' fragments are being "
                    "rebuilt on the other hosts (`shingle cluster status`)"
                )
            found.append(Finding(f"host:{name}", severity, message, {"host": name, **host}))
        return found


class DriveDegraded(AlertSource):
    """A drive reported I/O errors: still read, no longer written."""

    kind = "drive_io_errors"

    def find(self, catalog, settings):
        rows = catalog.read(
            lambda c: c.execute(
                select(DRIVES.c.id, DRIVES.c.path).where(DRIVES.c.state == "degraded")
            ).all()
        )
        return [
            Finding(
                f"drive:{r.id}",
                WARNING,
                f"drive {r.id} is degraded after I/O errors "
                f"({r.path}): read only; plan to replace it",
                {"drive_id": r.id},
            )
            for r in rows
        ]


class SmartHealth(AlertSource):
    """SMART pre-fail (overall assessment failed, an attribute failing now) and temperature."""

    kind = "smart"
    interval_s = 600.0

    def __init__(self, cache=None):
        from engine.admin.health import SmartCache

        self.cache = cache or SmartCache()

    def find(self, catalog, settings):
        rows = catalog.read(
            lambda c: c.execute(
                select(DRIVES.c.id, DRIVES.c.device, DRIVES.c.path, DRIVES.c.backend).where(
                    DRIVES.c.state != "removed"
                )
            ).all()
        )
        devices = {r.id: r.device or (r.path if r.backend == "zoned-block" else None) for r in rows}
        devices = {k: v for k, v in devices.items() if v}
        self.cache.refresh(list(devices.values()), settings.smartctl)
        found = []
        for drive_id, device in devices.items():
            report = self.cache.report(device, settings.smartctl)
            if not report.get("available"):
                continue
            failing = [a["name"] for a in report.get("attributes", []) if a.get("failed") == "now"]
            if report.get("passed") is False or failing:
                why = (
                    "SMART overall assessment FAILED"
                    if report.get("passed") is False
                    else "SMART attributes failing now: " + ", ".join(failing)
                )
                found.append(
                    Finding(
                        f"prefail:drive:{drive_id}",
                        CRITICAL,
                        f"drive {drive_id} ({device}): {why}; replace it",
                        {"drive_id": drive_id, "device": device},
                    )
                )
            temp = report.get("temperature_c")
            if temp is not None and temp >= settings.temperature_c:
                found.append(
                    Finding(
                        f"temperature:drive:{drive_id}",
                        WARNING,
                        f"drive {drive_id} ({device}) is at {temp} °C (alert at "
                        f"{settings.temperature_c:g} °C)",
                        {"drive_id": drive_id, "temperature_c": temp},
                    )
                )
        return found


class RedundancyReduced(AlertSource):
    """Stripes missing fragments: one or more further losses from losing data."""

    kind = "redundancy_reduced"

    def find(self, catalog, settings):
        from engine.lifecycle.drives import redundancy_status

        status = redundancy_status(catalog)
        if not status.reduced and not status.lost:
            return []
        severity = CRITICAL if status.lost or status.no_redundancy else WARNING
        return [
            Finding(
                "",
                severity,
                f"{status.reduced} of {status.stripes} stripes are "
                f"under-protected ({status.no_redundancy} with no redundancy left, "
                f"{status.lost} lost): `shingle rebuild` restores them (queued by itself once a "
                "missing drive is back); with too few drives left, add or replace drives first",
                status.to_dict(),
            )
        ]


class Capacity(AlertSource):
    """The pool fills: one alert at the warning share, another at the critical one."""

    kind = "capacity"

    def find(self, catalog, settings):
        from engine.lifecycle.drives import list_drives

        usable = free = 0
        ratio_of = [
            p.k / p.width
            for p in settings.policies.values()
            if getattr(p, "m", 0) and p.name == "warm"
        ]
        ratio = ratio_of[0] if ratio_of else 1.0
        for d in list_drives(catalog):
            if d.state not in ("online", "degraded", "draining"):
                continue
            reserve = settings.reserve_zones * d.zone_size
            usable += max(d.capacity_bytes - reserve, 0)
            free += max(d.capacity_bytes - reserve - d.written_bytes, 0)
        if not usable:
            return []
        used = 100.0 * (1 - free / usable)
        for level, severity in (
            (settings.capacity_critical_percent, CRITICAL),
            (settings.capacity_warn_percent, WARNING),
        ):
            if used >= level:
                return [
                    Finding(
                        f"{level:g}%",
                        severity,
                        f"the pool is {used:.0f} % full (alert "
                        f"at {level:g} %): free space or add drives",
                        {
                            "used_percent": round(used, 1),
                            "usable_bytes": int(usable * ratio),
                            "free_bytes": int(free * ratio),
                        },
                    )
                ]
        return []


class QuotaLimit(AlertSource):
    """A quota's tree passed its soft limit (a warning) or reached its hard limit (critical:
    writes there fail with EDQUOT), for bytes or files; one alert per quota and measure."""

    kind = "quota"

    def find(self, catalog, settings):
        from engine.catalog.database import sql_all

        rows = catalog.read(
            lambda c: sql_all(
                c,
                "SELECT id, root_ino, bytes_limit, files_limit, soft_bytes, soft_files, "
                "used_bytes, used_files FROM quotas ORDER BY id",
            )
        )
        found = []
        for qid, root, hard_b, hard_f, soft_b, soft_f, used_b, used_f in rows:
            for measure, used, hard, soft in (
                ("bytes", used_b, hard_b, soft_b),
                ("files", used_f, hard_f, soft_f),
            ):
                if hard is not None and used >= hard:
                    severity, level, which = CRITICAL, hard, "hard"
                elif soft is not None and used > soft:
                    severity, level, which = WARNING, soft, "soft"
                else:
                    continue
                found.append(
                    Finding(
                        f"quota:{qid}:{measure}",
                        severity,
                        f"quota {qid} (directory inode {root}) uses {used} {measure}, past its "
                        f"{which} limit of {level}",
                        {"quota_id": qid, "root_ino": root, "used": used, "limit": level},
                    )
                )
        return found


class ScrubUnrepairable(AlertSource):
    """The newest scrub found data it could not repair from redundancy."""

    kind = "scrub_unrepairable"

    def find(self, catalog, settings):
        row = catalog.read(
            lambda c: c.execute(
                select(JOBS.c.id, JOBS.c.result)
                .where(JOBS.c.kind == "scrub", JOBS.c.state.in_(("done", "warnings")))
                .order_by(JOBS.c.id.desc())
                .limit(1)
            ).first()
        )
        if row is None or not row.result:
            return []
        result = json.loads(row.result)
        bad = int(result.get("unrepairable", 0)) if isinstance(result, dict) else 0
        if not bad:
            return []
        return [
            Finding(
                f"job:{row.id}",
                CRITICAL,
                f"scrub job {row.id} found {bad} fragments it "
                "could not repair: those files have lost data (see events scrub.)",
                {"job": row.id, "unrepairable": bad},
            )
        ]


class JobFailed(AlertSource):
    """A job failed or was interrupted, and no later job of its kind ended well."""

    kind = "job_failed"

    def find(self, catalog, settings):
        rows = catalog.read(
            lambda c: c.execute(
                select(JOBS.c.id, JOBS.c.kind, JOBS.c.state, JOBS.c.message)
                .where(JOBS.c.state.in_(("done", "warnings", "failed", "interrupted")))
                .order_by(JOBS.c.id.desc())
                .limit(200)
            ).all()
        )
        good_since: set[str] = set()  # kinds with a good run newer than the row being looked at
        found = []
        for r in rows:  # newest first
            if r.state in ("done", "warnings"):
                good_since.add(r.kind)
            elif r.kind not in good_since:
                found.append(
                    Finding(
                        f"job:{r.id}",
                        WARNING,
                        f"{r.kind} job {r.id} {r.state}: {(r.message or '')[:200]}",
                        {"job": r.id, "state": r.state},
                    )
                )
        return found


class CertificateExpiry(AlertSource):
    """The web UI's TLS certificate expires soon (or has)."""

    kind = "cert_expiry"
    interval_s = 3600.0

    def find(self, catalog, settings):
        if not settings.cert_file:
            return []
        path = Path(settings.cert_file)
        if not path.is_file():
            return [Finding(str(path), WARNING, f"TLS certificate {path} is missing")]
        expires = certificate_not_after(path)
        days = (expires - datetime.now(UTC)).total_seconds() / 86400
        if days > settings.cert_warn_days:
            return []
        state = "expired" if days <= 0 else f"expires in {days:.0f} days"
        return [
            Finding(
                str(path),
                CRITICAL if days <= 3 else WARNING,
                f"the web UI's TLS certificate {state} ({expires:%Y-%m-%d}): renew {path}",
                {"not_after": expires.isoformat(), "days_left": round(days, 1)},
            )
        ]


class SmbProblem(AlertSource):
    """SMB cannot serve: smbd lacks a VFS module smb.conf names (every tree connect would fail
    with NT_STATUS_BAD_NETWORK_NAME), as the SMB service found before starting smbd or in its
    log (appliance/smb/samba.py writes the file; it is gone while SMB serves)."""

    kind = "smb_problem"

    def find(self, catalog, settings):
        if not settings.smb_problem_file:
            return []
        try:
            problem = json.loads(Path(settings.smb_problem_file).read_text())["problem"]
        except FileNotFoundError:
            return []
        except (OSError, ValueError, KeyError, TypeError) as exc:
            problem = f"unreadable SMB problem report {settings.smb_problem_file}: {exc}"
        return [Finding("smb", CRITICAL, f"SMB does not serve: {problem}"[:500])]


def certificate_not_after(path: Path) -> datetime:
    """A PEM certificate's notAfter (cryptography if installed, else the openssl command)."""
    try:
        from cryptography import x509

        cert = x509.load_pem_x509_certificate(path.read_bytes())
        return cert.not_valid_after_utc
    except ImportError:
        pass
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("cannot read certificates: no cryptography package, no openssl")
    out = subprocess.run(
        [openssl, "x509", "-enddate", "-noout", "-in", str(path)],
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    ).stdout
    stamp = out.strip().split("=", 1)[1]  # notAfter=Jan  1 00:00:00 2027 GMT
    return datetime.strptime(stamp, "%b %d %H:%M:%S %Y %Z").replace(tzinfo=UTC)


def default_sources(smart_cache=None) -> list[AlertSource]:
    return [
        DriveFailed(),
        HostLost(),
        DriveDegraded(),
        SmartHealth(smart_cache),
        RedundancyReduced(),
        Capacity(),
        QuotaLimit(),
        ScrubUnrepairable(),
        JobFailed(),
        CertificateExpiry(),
        SmbProblem(),
    ]


KINDS = tuple(s.kind for s in default_sources()) + ("catalog_unreachable",)


# -- the catalog side --------------------------------------------------------------------------
class AlertService:
    def __init__(self, catalog: Catalog):
        self.catalog = catalog

    def apply(
        self, kind: str, findings: list[Finding], now_ns: int | None = None, actor: str = "alerts"
    ) -> list[Notice]:
        """One evaluation of ``kind``: raise new alerts, refresh open ones, clear the gone."""
        now = now_ns or time.time_ns()
        wanted = {f.key: f for f in findings}

        def work(conn):
            open_rows = {
                r.key: r
                for r in conn.execute(
                    select(ALERTS).where(ALERTS.c.kind == kind, ALERTS.c.state.in_(OPEN))
                )
            }
            changed = []
            for key, row in open_rows.items():
                finding = wanted.get(key)
                if finding is None:
                    conn.execute(
                        ALERTS.update()
                        .where(ALERTS.c.id == row.id)
                        .values(state=CLEARED, cleared_ns=now)
                    )
                    record_in(
                        conn,
                        "alert.cleared",
                        f"alert {row.id} cleared: {row.message}",
                        actor=actor,
                        details={"alert": row.id, "kind": kind},
                    )
                    changed.append((row.id, CLEARED))
                else:
                    conn.execute(
                        ALERTS.update()
                        .where(ALERTS.c.id == row.id)
                        .values(
                            last_ns=now,
                            message=finding.message,
                            severity=finding.severity,
                            details=json.dumps(finding.details, default=str),
                        )
                    )
            for key, finding in wanted.items():
                if key in open_rows:
                    continue
                alert_id = conn.execute(
                    ALERTS.insert().values(
                        kind=kind,
                        key=key,
                        severity=finding.severity,
                        state=ACTIVE,
                        message=finding.message,
                        details=json.dumps(finding.details, default=str),
                        first_ns=now,
                        last_ns=now,
                    )
                ).inserted_primary_key[0]
                record_in(
                    conn,
                    "alert.raised",
                    f"alert {alert_id}: {finding.message}",
                    severity="error" if finding.severity == CRITICAL else "warning",
                    actor=actor,
                    details={"alert": alert_id, "kind": kind, "key": key},
                )
                changed.append((alert_id, ACTIVE))
            return changed

        changed = self.catalog.run(work, tracked=True, published=True)
        return [Notice(self.get(alert_id), change) for alert_id, change in changed]

    def record_cleared(self, kind: str, finding: Finding, first_ns: int) -> Notice:
        """An alert that was raised and cleared while it could not be stored (the catalog)."""
        now = time.time_ns()

        def work(conn):
            alert_id = conn.execute(
                ALERTS.insert().values(
                    kind=kind,
                    key=finding.key,
                    severity=finding.severity,
                    state=CLEARED,
                    message=finding.message,
                    details=json.dumps(finding.details, default=str),
                    first_ns=first_ns,
                    last_ns=now,
                    cleared_ns=now,
                )
            ).inserted_primary_key[0]
            record_in(
                conn,
                "alert.cleared",
                f"alert {alert_id} cleared: {finding.message}",
                actor="alerts",
                details={"alert": alert_id, "kind": kind},
            )
            return alert_id

        return Notice(self.get(self.catalog.run(work, tracked=True, published=True)), CLEARED)

    def acknowledge(self, alert_id: int, actor: str) -> AlertRecord:
        now = time.time_ns()

        def work(conn):
            row = conn.execute(select(ALERTS).where(ALERTS.c.id == alert_id)).first()
            if row is None:
                raise errors.NotFound(f"no alert {alert_id}: see `shingle alerts list`")
            if row.state != ACTIVE:
                raise errors.InvalidArgument(
                    f"alert {alert_id} is {row.state}: only an active alert can be acknowledged"
                )
            conn.execute(
                ALERTS.update()
                .where(ALERTS.c.id == alert_id)
                .values(state=ACKNOWLEDGED, acknowledged_ns=now, acknowledged_by=actor[:64])
            )
            record_in(
                conn,
                "alert.acknowledged",
                f"alert {alert_id} acknowledged: {row.message}",
                actor=actor,
                details={"alert": alert_id},
            )

        self.catalog.run(work, tracked=True, published=True)
        return self.get(alert_id)

    def get(self, alert_id: int) -> AlertRecord:
        row = self.catalog.read(
            lambda c: c.execute(select(ALERTS).where(ALERTS.c.id == alert_id)).first()
        )
        if row is None:
            raise errors.NotFound(f"no alert {alert_id}: see `shingle alerts list`")
        return _record(row)

    def list(self, states: tuple[str, ...] | None = None, limit: int = 200) -> list[AlertRecord]:
        """Newest first; open ones (active, acknowledged) before cleared ones."""
        query = select(ALERTS)
        if states:
            query = query.where(ALERTS.c.state.in_(states))
        rows = self.catalog.read(
            lambda c: c.execute(query.order_by(ALERTS.c.id.desc()).limit(limit)).all()
        )
        records = [_record(r) for r in rows]
        return sorted(records, key=lambda a: (a.state == CLEARED, -a.id))

    def count_active(self) -> dict[str, int]:
        """severity -> active alerts (the web UI's banner)."""
        from sqlalchemy import func

        rows = self.catalog.read(
            lambda c: c.execute(
                select(ALERTS.c.severity, func.count())
                .where(ALERTS.c.state == ACTIVE)
                .group_by(ALERTS.c.severity)
            ).all()
        )
        return {r[0]: int(r[1]) for r in rows}


# -- the schedule ------------------------------------------------------------------------------
class AlertMonitor:
    """Runs each source when its interval is due and hands raised and cleared alerts to
    ``deliver`` (engine.admin.notify.Notifier.deliver: it queues, never blocks)."""

    def __init__(
        self,
        catalog: Catalog,
        settings: AlertSettings,
        *,
        deliver=None,
        sources: list[AlertSource] | None = None,
        interval_scale: float = 1.0,
    ):
        self.catalog = catalog
        self.settings = settings
        self.service = AlertService(catalog)
        self.deliver = deliver or (lambda notice: None)
        self.sources = sources if sources is not None else default_sources()
        self.interval_scale = interval_scale
        self._last: dict[str, float] = {}
        self._catalog_down: tuple[int, Finding] | None = None

    def tick(self, *, force: bool = False) -> list[Notice]:
        """Evaluate the sources that are due (all with ``force``); returns what changed."""
        if not self._catalog_answers():
            return []
        notices: list[Notice] = []
        now = time.monotonic()
        for source in self.sources:
            due = self._last.get(source.kind, -1e18) + source.interval_s * self.interval_scale
            if not force and now < due:
                continue
            self._last[source.kind] = now
            try:
                findings = source.find(self.catalog, self.settings)
                notices += self.service.apply(source.kind, findings)
            except CatalogUnreachable:
                pass  # the catalog's outage log counts it; the next tick raises catalog_unreachable
            except Exception as exc:  # one broken source must not stop the others
                log.warning("alert source %s failed: %s", source.kind, exc)
        for notice in notices:
            log.warning("alert %s: %s", notice.change, notice.alert.message)
            self.deliver(notice)
        return notices

    def _catalog_answers(self) -> bool:
        try:
            self.catalog.read(lambda c: c.execute(text("SELECT 1")).scalar())
        except Exception as exc:
            if self._catalog_down is None:
                finding = Finding("", CRITICAL, f"the catalog is unreachable: {exc}"[:300])
                self._catalog_down = (time.time_ns(), finding)
                now = time.time_ns()
                self.deliver(
                    Notice(
                        AlertRecord(
                            0,
                            "catalog_unreachable",
                            "",
                            CRITICAL,
                            ACTIVE,
                            finding.message,
                            {},
                            now,
                            now,
                            None,
                            None,
                            None,
                        ),
                        ACTIVE,
                    )
                )
                log.error("alert: %s", finding.message)
            return False
        if self._catalog_down is not None:
            first_ns, finding = self._catalog_down
            self._catalog_down = None
            self.deliver(self.service.record_cleared("catalog_unreachable", finding, first_ns))
        return True
