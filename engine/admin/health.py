"""Drive health: SMART through ``smartctl --json -x`` and I/O counters from psutil.

smartctl reports three shapes of health data: ATA (an attribute table),
SCSI/SAS (error counter logs, grown defects) and NVMe (a health information
log). ``parse_smart`` maps each onto one ``SmartReport`` so pages and alerts
need not know the protocol. Drives without SMART (emulated drives, a missing
smartctl, a device that cannot be opened) give a report with
``available=False`` and a reason, never an exception."""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import asdict, dataclass, field

import psutil

SMARTCTL_TIMEOUT_S = 30
# smartctl's exit status is a bit mask; these bits mean "no data came back".
EXIT_CMDLINE, EXIT_OPEN_FAILED = 0x01, 0x02
EXIT_DISK_FAILING = 0x08
SELF_TEST_KINDS = ("short", "long", "conveyance")

# ATA attribute ids whose raw value admins watch most (Backblaze's failure predictors).
ATA_REALLOCATED, ATA_POWER_ON_HOURS, ATA_TEMPERATURE = 5, 9, 194
ATA_REPORTED_UNCORRECT, ATA_PENDING, ATA_OFFLINE_UNCORRECTABLE = 187, 197, 198


@dataclass
class SmartAttribute:
    id: int
    name: str
    value: int | None
    worst: int | None
    threshold: int | None
    raw: int | None
    raw_string: str
    failed: str  # smartctl's when_failed: "", "now" or "past"


@dataclass
class SmartReport:
    available: bool
    device: str | None = None
    reason: str = ""  # why there is no (or only partial) SMART data
    protocol: str | None = None  # "ATA" | "SCSI" | "NVMe"
    model: str | None = None
    serial: str | None = None
    firmware: str | None = None
    capacity_bytes: int | None = None
    passed: bool | None = None  # SMART overall health self-assessment
    temperature_c: int | None = None
    power_on_hours: int | None = None
    reallocated_sectors: int | None = None  # ATA id 5; SCSI grown defect list
    pending_sectors: int | None = None  # ATA id 197
    offline_uncorrectable: int | None = None  # ATA id 198; SCSI total uncorrected errors
    media_errors: int | None = None  # NVMe
    percentage_used: int | None = None  # NVMe endurance used
    available_spare: int | None = None  # NVMe
    critical_warning: int | None = None  # NVMe bit mask
    rotation_rate: int | None = None  # rpm; 0 for solid state
    self_test: str | None = None  # status text of the last or running self-test
    attributes: list[SmartAttribute] = field(default_factory=list)
    exit_status: int | None = None
    messages: list[str] = field(default_factory=list)

    @property
    def overall(self) -> str:
        """One word for a badge: PASSED, FAILED, UNKNOWN or 'no SMART data'."""
        if not self.available:
            return "no SMART data"
        if self.passed is None:
            return "UNKNOWN"
        return "PASSED" if self.passed else "FAILED"

    def to_dict(self) -> dict:
        data = asdict(self)
        data["overall"] = self.overall
        return data


def no_smart(device: str | None, reason: str) -> SmartReport:
    return SmartReport(available=False, device=device, reason=reason)


def _int(value) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return int(value)
    return None


def parse_smart(data: dict, device: str | None = None) -> SmartReport:
    """One ``smartctl --json -x`` document (ATA, SCSI/SAS or NVMe) -> SmartReport."""
    if not isinstance(data, dict):
        return no_smart(device, f"smartctl output is not a JSON object (got {type(data).__name__})")
    info = data.get("device") or {}
    device = info.get("name") or device
    status = data.get("smartctl") or {}
    exit_status = _int(status.get("exit_status"))
    messages = [m.get("string", "") for m in status.get("messages", []) if isinstance(m, dict)]
    if exit_status is not None and exit_status & (EXIT_CMDLINE | EXIT_OPEN_FAILED):
        reason = "; ".join(messages) or f"smartctl exit status {exit_status}"
        return SmartReport(
            available=False,
            device=device,
            reason=reason,
            exit_status=exit_status,
            messages=messages,
        )
    protocol = info.get("protocol")
    if protocol is None:
        if "nvme_smart_health_information_log" in data:
            protocol = "NVMe"
        elif "ata_smart_attributes" in data:
            protocol = "ATA"
        elif "scsi_vendor" in data or "scsi_grown_defect_list" in data:
            protocol = "SCSI"
    capacity = _int((data.get("user_capacity") or {}).get("bytes")) or _int(
        data.get("nvme_total_capacity")
    )
    model = data.get("model_name") or data.get("scsi_model_name")
    if not model and data.get("scsi_vendor"):
        model = f"{data.get('scsi_vendor', '')} {data.get('scsi_product', '')}".strip()
    smart_status = data.get("smart_status") or {}
    report = SmartReport(
        available=True,
        device=device,
        protocol=protocol,
        model=model,
        serial=data.get("serial_number"),
        firmware=data.get("firmware_version") or data.get("scsi_revision"),
        capacity_bytes=capacity,
        passed=smart_status["passed"] if isinstance(smart_status.get("passed"), bool) else None,
        temperature_c=_int((data.get("temperature") or {}).get("current")),
        power_on_hours=_int((data.get("power_on_time") or {}).get("hours")),
        rotation_rate=_int(data.get("rotation_rate")),
        exit_status=exit_status,
        messages=messages,
    )
    if protocol == "ATA":
        _parse_ata(data, report)
    elif protocol == "SCSI":
        _parse_scsi(data, report)
    elif protocol == "NVMe":
        _parse_nvme(data, report)
    if report.passed is None and exit_status is not None and exit_status & EXIT_DISK_FAILING:
        report.passed = False
    if report.passed is None:
        report.reason = "the drive did not report an overall SMART health status"
    return report


def _parse_ata(data: dict, report: SmartReport) -> None:
    table = (data.get("ata_smart_attributes") or {}).get("table") or []
    by_id = {}
    for row in table:
        if not isinstance(row, dict) or _int(row.get("id")) is None:
            continue
        raw = row.get("raw") or {}
        attr = SmartAttribute(
            id=int(row["id"]),
            name=str(row.get("name", "")),
            value=_int(row.get("value")),
            worst=_int(row.get("worst")),
            threshold=_int(row.get("thresh")),
            raw=_int(raw.get("value")),
            raw_string=str(raw.get("string", "")),
            failed=str(row.get("when_failed", "")),
        )
        report.attributes.append(attr)
        by_id[attr.id] = attr
    report.reallocated_sectors = by_id[ATA_REALLOCATED].raw if ATA_REALLOCATED in by_id else None
    report.pending_sectors = by_id[ATA_PENDING].raw if ATA_PENDING in by_id else None
    if ATA_OFFLINE_UNCORRECTABLE in by_id:
        report.offline_uncorrectable = by_id[ATA_OFFLINE_UNCORRECTABLE].raw
    if report.power_on_hours is None and ATA_POWER_ON_HOURS in by_id:
        report.power_on_hours = _leading_int(by_id[ATA_POWER_ON_HOURS].raw_string)
    if report.temperature_c is None and ATA_TEMPERATURE in by_id:
        # The raw value packs min/max into high bytes; the string's first number
        # is the current reading.
        report.temperature_c = _leading_int(by_id[ATA_TEMPERATURE].raw_string)
    test = ((data.get("ata_smart_data") or {}).get("self_test") or {}).get("status") or {}
    report.self_test = test.get("string")


def _parse_scsi(data: dict, report: SmartReport) -> None:
    report.reallocated_sectors = _int(data.get("scsi_grown_defect_list"))
    log = data.get("scsi_error_counter_log") or {}
    uncorrected = [
        _int((log.get(kind) or {}).get("total_uncorrected_errors"))
        for kind in ("read", "write", "verify")
    ]
    known = [n for n in uncorrected if n is not None]
    report.offline_uncorrectable = sum(known) if known else None
    tests = (data.get("scsi_self_test_0") or {}).get("result") or {}
    report.self_test = tests.get("string")


def _parse_nvme(data: dict, report: SmartReport) -> None:
    log = data.get("nvme_smart_health_information_log") or {}
    report.media_errors = _int(log.get("media_errors"))
    report.percentage_used = _int(log.get("percentage_used"))
    report.available_spare = _int(log.get("available_spare"))
    report.critical_warning = _int(log.get("critical_warning"))
    if report.temperature_c is None:
        report.temperature_c = _int(log.get("temperature"))
    if report.power_on_hours is None:
        report.power_on_hours = _int(log.get("power_on_hours"))
    if report.passed is None and report.critical_warning is not None:
        report.passed = report.critical_warning == 0
    test = (data.get("nvme_self_test_log") or {}).get("current_self_test_operation") or {}
    report.self_test = test.get("string")


def _leading_int(text: str) -> int | None:
    digits = ""
    for ch in text.strip():
        if not ch.isdigit():
            break
        digits += ch
    return int(digits) if digits else None


def _run_smartctl(smartctl: str, args: list[str]) -> tuple[dict | None, str]:
    """(parsed JSON, error text); smartctl exits non-zero for mere warnings, so the JSON decides."""
    if not os.path.isfile(smartctl) or not os.access(smartctl, os.X_OK):
        return None, f"smartctl not found or not executable at {smartctl} (set [smart] smartctl)"
    try:
        proc = subprocess.run(
            [smartctl, *args], capture_output=True, timeout=SMARTCTL_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return None, f"smartctl {' '.join(args)} did not answer within {SMARTCTL_TIMEOUT_S} s"
    except OSError as exc:
        return None, f"smartctl at {smartctl} could not run: {exc.strerror}"
    try:
        return json.loads(proc.stdout), ""
    except ValueError:
        text = (proc.stderr or proc.stdout).decode(errors="replace").strip()[:300]
        return (
            None,
            f"smartctl exit status {proc.returncode} without JSON output: {text or 'no output'}",
        )


def read_smart(device: str | None, smartctl: str) -> SmartReport:
    """SMART of one block device; emulated drives (no device) have none.

    ``-n standby`` keeps a spun-down drive asleep: looking at a page must not wake the pool."""
    if not device:
        return no_smart(None, "emulated drive: no block device to query")
    data, error = _run_smartctl(smartctl, ["--json", "-x", "-n", "standby", device])
    if data is None:
        return no_smart(device, error)
    return parse_smart(data, device)


def start_self_test(device: str | None, smartctl: str, kind: str = "short") -> str:
    """Ask the drive to run a SMART self-test in the background; returns smartctl's message.

    Raises ValueError with the reason when the test cannot be started."""
    if kind not in SELF_TEST_KINDS:
        raise ValueError(f"self-test {kind!r}: expected one of {', '.join(SELF_TEST_KINDS)}")
    if not device:
        raise ValueError("emulated drive: no block device, so no SMART self-test")
    data, error = _run_smartctl(smartctl, ["--json", "-t", kind, device])
    if data is None:
        raise ValueError(error)
    status = data.get("smartctl") or {}
    messages = [m.get("string", "") for m in status.get("messages", []) if isinstance(m, dict)]
    exit_status = _int(status.get("exit_status")) or 0
    if exit_status & (EXIT_CMDLINE | EXIT_OPEN_FAILED | 0x04):
        raise ValueError("; ".join(messages) or f"smartctl exit status {exit_status}")
    started = (data.get("ata_smart_data") or {}).get("self_test") or {}
    return "; ".join(messages) or str(
        (started.get("status") or {}).get("string") or f"{kind} self-test started"
    )


# -- I/O counters -----------------------------------------------------------------
def block_device_of(path: str) -> str | None:
    """Kernel name of the block device under ``path`` (a device node or a
    folder on a disk), or None."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    import stat as stat_mod

    dev = st.st_rdev if stat_mod.S_ISBLK(st.st_mode) else st.st_dev
    major, minor = os.major(dev), os.minor(dev)
    if major == 0:  # overlay, tmpfs and other virtual filesystems have no block device
        return None
    try:
        with open(f"/sys/dev/block/{major}:{minor}/uevent") as fh:
            for line in fh:
                if line.startswith("DEVNAME="):
                    return line.strip().split("=", 1)[1]
    except OSError:
        return None
    return None


def io_counters(path_or_device: str | None) -> dict | None:
    """psutil's cumulative I/O counters for the disk holding a drive, or None when unknown."""
    if not path_or_device:
        return None
    name = block_device_of(path_or_device)
    if name is None:
        return None
    counters = psutil.disk_io_counters(perdisk=True, nowrap=True).get(name)
    if counters is None:
        return None
    return {"disk": name, **counters._asdict()}


# -- SMART readings kept for a short while ------------------------------------------------------
SMART_TTL_S = 60  # smartctl -x takes a while on real drives; pages reuse a reading this long
SMART_PARALLEL = 8


class SmartCache:
    """SMART reports by device, reused for ``ttl_s``; stale ones are read in parallel (one
    smartctl per drive: a 24-bay chassis in one smartctl's time)."""

    def __init__(self, ttl_s: float = SMART_TTL_S, parallel: int = SMART_PARALLEL):
        self.ttl_s = ttl_s
        self.parallel = parallel
        self._reports: dict = {}  # device -> (monotonic time, report dict)

    def _fresh(self, device: str | None) -> dict | None:
        hit = self._reports.get(device)
        if hit is not None and time.monotonic() - hit[0] < self.ttl_s:
            return hit[1]
        return None

    def report(self, device: str | None, smartctl: str) -> dict:
        """The drive's SMART report (``SmartReport.to_dict()``), from the cache when fresh."""
        hit = self._fresh(device)
        if hit is not None:
            return hit
        report = read_smart(device, smartctl).to_dict()
        self._reports[device] = (time.monotonic(), report)
        return report

    def refresh(self, devices: list[str | None], smartctl: str) -> None:
        """Read the stale reports of ``devices`` in parallel."""
        stale = [d for d in set(devices) if d and self._fresh(d) is None]
        if len(stale) > 1:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(max_workers=min(self.parallel, len(stale))) as pool:
                list(pool.map(lambda d: self.report(d, smartctl), stale))

    def start_self_test(self, device: str | None, smartctl: str, kind: str = "short") -> str:
        """``start_self_test``, then forget the device's reading so the next view shows the test."""
        message = start_self_test(device, smartctl, kind)
        self._reports.pop(device, None)
        return message
