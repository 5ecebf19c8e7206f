"""One finding of `shingle doctor` (appliance/host/doctor.py, clusterdoctor.py)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class Check:
    name: str
    status: str  # ok | warn | fail
    detail: str
    fix: str = ""

    def as_dict(self) -> dict:
        return asdict(self)
