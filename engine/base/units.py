"""Human units for what people read: sizes in KiB/MiB/GiB/TiB, durations as "17.3 s" or "2 min 5 s".

One helper for the CLI, the web UI and job messages, so a number reads the same everywhere.
Machine output (``--json``, the API, /metrics) keeps plain bytes and seconds."""

from __future__ import annotations

import re

SIZE_SCALES = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def format_size(n: int | float) -> str:
    """``1536`` -> ``"1.5 KiB"``; below 1 KiB the byte count itself."""
    for unit, scale in SIZE_SCALES:
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def format_duration(seconds: float) -> str:
    """``17.257`` -> ``"17.3 s"``, ``125`` -> ``"2 min 5 s"``, ``7300`` -> ``"2 h 1 min"``,
    ``2592000`` -> ``"30 d"`` (a second part that is zero is left out)."""
    if seconds < 0:
        return "-" + format_duration(-seconds)
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds >= 0.1 or seconds == 0 else f"{seconds * 1000:.1f} ms"
    whole = round(seconds)
    if whole < 3600:
        big, unit, small, small_unit = whole // 60, "min", whole % 60, "s"
    elif whole < 86400:
        big, unit, small, small_unit = whole // 3600, "h", whole % 3600 // 60, "min"
    else:
        big, unit, small, small_unit = whole // 86400, "d", whole % 86400 // 3600, "h"
    return f"{big} {unit} {small} {small_unit}" if small else f"{big} {unit}"


DURATION_UNITS = {
    "ms": 0.001,
    "s": 1,
    "sec": 1,
    "min": 60,
    "m": 60,
    "h": 3600,
    "hr": 3600,
    "d": 86400,
    "day": 86400,
    "days": 86400,
    "w": 7 * 86400,
}
_DURATION_PART = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*")


def parse_duration(text: str | int | float) -> float:
    """What people type for a duration -> seconds: ``"30 d"``, ``"2 h 30 min"``, ``"90s"``,
    ``"1.5 h"``; a bare number (or a number given as one) is seconds. Reads everything
    ``format_duration`` writes. ValueError says what was expected."""
    if isinstance(text, bool):
        raise ValueError(f"{text!r}: expected a duration such as 30 d, 12 h, 90 min or 45 s")
    if isinstance(text, (int, float)):
        if text < 0:
            raise ValueError(f"{text!r}: expected a duration >= 0")
        return float(text)
    cleaned = text.strip().lower()
    total, pos = 0.0, 0
    while pos < len(cleaned):
        m = _DURATION_PART.match(cleaned, pos)
        if not m or m.end() == pos or m[2] not in DURATION_UNITS and m[2] != "":
            break
        total += float(m[1]) * DURATION_UNITS.get(m[2], 1)
        pos = m.end()
    if not cleaned or pos < len(cleaned):
        raise ValueError(
            f"{text!r}: expected a duration such as 30 d, 12 h, 90 min or 45 s "
            f"(units: {', '.join(DURATION_UNITS)})"
        )
    return total


def format_value(key: str, value):
    """A report field for people: ``*_bytes`` and ``bytes_*`` as a size, ``*_s`` as a duration
    (``*_per_s`` is a rate and stays a number), other floats rounded."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    words = key.split("_")
    if "bytes" in words and "per" not in words:
        return format_size(value)
    if words[-1] == "s" and "per" not in words:
        return format_duration(value)
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return value
