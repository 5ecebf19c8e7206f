"""The lifecycle jobs as runners for the daemon's job queue (appliance.maintenance).

``runners(...)`` maps a job kind to ``runner(params, progress, actor) -> JSON-able
result``: "tier", "clean", "scrub", "rebuild", "drain" (params {"drive": id or
uuid}), "drive-add" (params {"path", "size", "zone_size", "preallocate"}) and "drive-replace"
(the same and "old"). Rebuild, drain and the drive jobs return ``warnings`` when stripes stay
under-protected (engine/lifecycle/replace.py); the job then ends "done with warnings".
The tiering policy is read from the catalog settings at each run
(``tiering.<TieringPolicy field>`` and ``tiering.path_rules``, which the web UI
edits), so a change applies at the next round without a restart.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import fields
from typing import Any

from engine.catalog.database import Catalog
from engine.lifecycle import replace
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


def runners(
    namespace,
    datapath,
    catalog: Catalog,
    *,
    reads: ReadTracker | None = None,
    scrub_bytes_per_s: float | None = None,
    rebuild_bytes_per_s: float | None = None,
    clean_bytes_per_s: float | None = None,
) -> dict[str, Runner]:
    def tier(params, progress, actor):
        policy = tiering_policy(catalog)
        return (
            Tiering(namespace, datapath, catalog, policy, reads=reads)
            .run(progress=progress, actor=actor)
            .to_dict()
        )

    def clean(params, progress, actor):
        report = Cleaner(datapath, catalog, bytes_per_s=clean_bytes_per_s).run(
            progress=progress,
            actor=actor,
            max_zones=params.get("max_zones"),
            target_free_zones=params.get("target_free_zones"),
        )
        return report.to_dict()

    def scrub(params, progress, actor):
        report = Scrubber(datapath, catalog, bytes_per_s=scrub_bytes_per_s).run(
            progress=progress, actor=actor, drive_id=params.get("drive")
        )
        return report.to_dict()

    def rebuild(params, progress, actor):
        report = Rebuilder(datapath, catalog, bytes_per_s=rebuild_bytes_per_s).run(
            progress=progress, actor=actor
        )
        return replace.rebuild_report(datapath, report)

    def drain(params, progress, actor):
        report = drain_drive(
            datapath,
            catalog,
            params["drive"],
            progress=progress,
            actor=actor,
            bytes_per_s=rebuild_bytes_per_s,
        )
        return replace.rebuild_report(datapath, report)

    def drive_options(params) -> dict:
        return {
            "size": params.get("size"),
            "zone_size": params.get("zone_size"),
            "preallocate": params.get("preallocate", True),
        }

    def drive_add(params, progress, actor):
        return replace.add_drive(
            datapath,
            catalog,
            params["path"],
            **drive_options(params),
            progress=progress,
            actor=actor,
            bytes_per_s=rebuild_bytes_per_s,
        )

    def drive_replace(params, progress, actor):
        return replace.replace_drive(
            datapath,
            catalog,
            params["old"],
            params["path"],
            **drive_options(params),
            progress=progress,
            actor=actor,
            bytes_per_s=rebuild_bytes_per_s,
        )

    return {
        "tier": tier,
        "clean": clean,
        "scrub": scrub,
        "rebuild": rebuild,
        "drain": drain,
        "drive-add": drive_add,
        "drive-replace": drive_replace,
    }
