"""The lifecycle jobs as runners for the daemon's job queue (appliance.maintenance).

``runners(...)`` maps a job kind to ``runner(params, progress, actor) -> JSON-able result``:
"tier", "clean", "scrub", "rebuild", "drain" (params {"drive": id or uuid}), "drive-add"
(params {"path", "size", "zone_size", "preallocate"}), "drive-replace" (the same and "old"),
and the hosts' (engine/lifecycle/hostops.py): "host-join" (params {"address"}), "host-drain"
and "host-remove" ({"host"}), "host-replace" ({"host", "address"}); a host job's
{"rate_mib_s"} overrides the configured rebuild pace for that job. Rebuild, drain, the drive
and the host jobs return ``warnings`` when stripes stay under-protected
(engine/lifecycle/replace.py); the job then ends "done with warnings". The tiering policy is
read from the catalog settings at each run (``tiering.<TieringPolicy field>`` and
``tiering.path_rules``, which the web UI edits), so a change applies at the next round
without a restart."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import fields
from typing import Any

from engine.catalog.database import Catalog
from engine.lifecycle import hostops, replace
from engine.lifecycle.cleaning import Cleaner
from engine.lifecycle.rebuild import Rebuilder, drain_drive
from engine.lifecycle.scrub import Scrubber
from engine.lifecycle.tiering import ReadTracker, Tiering, TieringPolicy

SETTING_PREFIX = "tiering."
Runner = Callable[[dict, Callable, str], object]


def tiering_policy(catalog: Catalog) -> TieringPolicy:
    """The TieringPolicy the settings describe (defaults for anything unset)."""
    values: dict[str, Any] = {}
    for f in fields(TieringPolicy):
        raw = catalog.get_setting(SETTING_PREFIX + f.name)
        if raw is None:
            continue
        if f.name == "path_rules":
            values[f.name] = [tuple(rule) for rule in json.loads(raw)]
        elif f.name == "promote_reads":
            values[f.name] = int(float(raw))
        else:
            values[f.name] = None if raw in ("", "none", "null") else float(raw)
    return TieringPolicy(**values).validate()


class LifecycleJobs:
    """One method per job kind; the rates are the daemon's configured paces (None: unpaced)."""

    def __init__(
        self,
        namespace,
        datapath,
        catalog: Catalog,
        *,
        reads: ReadTracker | None = None,
        scrub_bytes_per_s: float | None = None,
        rebuild_bytes_per_s: float | None = None,
        clean_bytes_per_s: float | None = None,
    ) -> None:
        self.namespace = namespace
        self.datapath = datapath
        self.catalog = catalog
        self.reads = reads
        self.scrub_bytes_per_s = scrub_bytes_per_s
        self.rebuild_bytes_per_s = rebuild_bytes_per_s
        self.clean_bytes_per_s = clean_bytes_per_s

    def runners(self) -> dict[str, Runner]:
        return {
            "tier": self.tier,
            "clean": self.clean,
            "scrub": self.scrub,
            "rebuild": self.rebuild,
            "drain": self.drain,
            "drive-add": self.drive_add,
            "drive-replace": self.drive_replace,
            "host-join": self.host_join,
            "host-drain": self.host_drain,
            "host-remove": self.host_remove,
            "host-replace": self.host_replace,
        }

    def tier(self, params, progress, actor):
        policy = tiering_policy(self.catalog)
        tiering = Tiering(self.namespace, self.datapath, self.catalog, policy, reads=self.reads)
        return tiering.run(progress=progress, actor=actor).to_dict()

    def clean(self, params, progress, actor):
        cleaner = Cleaner(self.datapath, self.catalog, bytes_per_s=self.clean_bytes_per_s)
        report = cleaner.run(
            progress=progress,
            actor=actor,
            max_zones=params.get("max_zones"),
            target_free_zones=params.get("target_free_zones"),
        )
        return report.to_dict()

    def scrub(self, params, progress, actor):
        scrubber = Scrubber(self.datapath, self.catalog, bytes_per_s=self.scrub_bytes_per_s)
        return scrubber.run(progress=progress, actor=actor, drive_id=params.get("drive")).to_dict()

    def rebuild(self, params, progress, actor):
        rebuilder = Rebuilder(self.datapath, self.catalog, bytes_per_s=self.rebuild_bytes_per_s)
        report = rebuilder.run(progress=progress, actor=actor)
        return replace.rebuild_report(self.datapath, report)

    def drain(self, params, progress, actor):
        report = drain_drive(
            self.datapath,
            self.catalog,
            params["drive"],
            progress=progress,
            actor=actor,
            bytes_per_s=self.rebuild_bytes_per_s,
        )
        return replace.rebuild_report(self.datapath, report)

    def drive_add(self, params, progress, actor):
        return replace.add_drive(
            self.datapath,
            self.catalog,
            params["path"],
            **_drive_options(params),
            progress=progress,
            actor=actor,
            bytes_per_s=self.rebuild_bytes_per_s,
        )

    def drive_replace(self, params, progress, actor):
        return replace.replace_drive(
            self.datapath,
            self.catalog,
            params["old"],
            params["path"],
            **_drive_options(params),
            progress=progress,
            actor=actor,
            bytes_per_s=self.rebuild_bytes_per_s,
        )

    def host_pace(self, params) -> float | None:
        """The job's own pace (``rate_mib_s``), else the configured rebuild pace."""
        rate = params.get("rate_mib_s")
        return float(rate) * (1 << 20) if rate else self.rebuild_bytes_per_s

    def host_join(self, params, progress, actor):
        return hostops.join_host(
            self.datapath,
            self.catalog,
            params["address"],
            progress=progress,
            actor=actor,
            bytes_per_s=self.host_pace(params),
        )

    def host_drain(self, params, progress, actor):
        return hostops.drain_host(
            self.datapath,
            self.catalog,
            params["host"],
            progress=progress,
            actor=actor,
            bytes_per_s=self.host_pace(params),
        )

    def host_remove(self, params, progress, actor):
        return hostops.remove_host(
            self.datapath,
            self.catalog,
            params["host"],
            progress=progress,
            actor=actor,
            bytes_per_s=self.host_pace(params),
        )

    def host_replace(self, params, progress, actor):
        return hostops.replace_host(
            self.datapath,
            self.catalog,
            params["host"],
            params["address"],
            progress=progress,
            actor=actor,
            bytes_per_s=self.host_pace(params),
        )


def _drive_options(params) -> dict:
    return {
        "size": params.get("size"),
        "zone_size": params.get("zone_size"),
        "preallocate": params.get("preallocate", True),
    }


def runners(namespace, datapath, catalog: Catalog, **paces) -> dict[str, Runner]:
    """The job kinds' runners (see LifecycleJobs for the keyword paces)."""
    return LifecycleJobs(namespace, datapath, catalog, **paces).runners()
