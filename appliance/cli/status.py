"""`shingle status`: catalog, drives, capacity, redundancy, SMB and the cluster's leader at a
glance."""

from __future__ import annotations

import json

from appliance.cli.common import load_config
from engine.base.units import format_size


def cmd_status(args) -> int:
    from appliance.heads import read_status
    from appliance.runtime import open_catalog
    from appliance.status import gather, leader_report, mds_address_report, smb_report

    config = load_config(args)
    catalog = open_catalog(config)
    try:
        report = gather(catalog, config.policies(), config.get("storage.reserve_zones"))
        add_device_errors(report["drives"], catalog)
        report["smb"] = smb_report(config.data_dir, catalog)
        report["leader"] = leader_report(catalog, config)
        report["mds_address"] = mds_address_report(config)
        report["heads"] = read_status(config.data_dir)
    finally:
        catalog.close()
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        print_report(report)
    return 0


def add_device_errors(drives: list[dict], catalog) -> None:
    """Each zoned block device's error counts from the daemon's newest sample (its faults:
    bad sectors, zones gone read-only or offline; and off-pointer writes, expected 0)."""
    from engine.admin.metrics import latest

    samples = latest(catalog)
    for drive in drives:
        for key in ("device_errors", "off_pointer_errors"):
            value = samples.get(f"drive_{drive['id']}_{key}")
            if value is not None:
                drive[key] = int(value)


def device_error_note(drive: dict) -> str:
    """What a drive line says of its zoned device's faults ("" when it has none)."""
    device, off_pointer = drive.get("device_errors"), drive.get("off_pointer_errors")
    if not device and not off_pointer:
        return ""
    note = f"  ({device or 0} device errors"
    if off_pointer:
        note += f", {off_pointer} of them off-pointer writes: expected 0"
    return note + ")"


def print_report(report: dict) -> None:
    from appliance.status import leader_line, mds_address_line, smb_line

    fmt = format_size
    cat, cap = report["catalog"], report["capacity"]
    print(
        f"catalog   {cat['backend']} {cat['url']} (schema {cat['revision']}), {cat['inodes']} "
        "inodes"
    )
    print(
        f"capacity  usable {fmt(cap['usable_bytes'])}, free {fmt(cap['free_bytes'])}, "
        f"raw {fmt(cap['raw_bytes'])}, live {fmt(cap['live_bytes'])}, garbage "
        f"{fmt(cap['garbage_bytes'])}"
    )
    red = report["redundancy"]
    if red["under_protected"] or red["lost"]:
        print(
            f"redundancy REDUCED: {red['under_protected']} of {red['stripes']} stripes "
            f"under-protected, {red['no_redundancy']} with no redundancy left, {red['lost']} "
            "lost; `shingle drives add PATH` / `drives replace OLD PATH`, then `shingle rebuild`"
        )
    else:
        print(f"redundancy full: {red['stripes']} stripes, none under-protected")
    hosts = report["hosts"]
    if hosts["count"] > 1:
        losable = hosts["losable"]
        print(
            f"hosts     {hosts['count']}; may lose "
            f"{hosts['losable_by_placement'] if losable is None else losable} without losing "
            "data"
        )
    print(f"drives    {len(report['drives'])}")
    for d in report["drives"]:
        print(
            f"  {d['id']:>3} {d['state']:<9} {fmt(d['size_bytes']):>10}  zones {d['zones_empty']} "
            f"empty / {d['zones_open']} open / {d['zones_full']} full  {d['path']}"
            + device_error_note(d)
        )
    print(f"smb       {smb_line(report['smb'])}")
    leader = leader_line(report.get("leader"))
    if leader is not None:
        print(f"leader    {leader}")
    floating = mds_address_line(report.get("mds_address"))
    if floating is not None:
        print(f"mds addr  {floating}")
    if report.get("heads"):
        print(f"heads     {heads_line(report['heads'])}")


def heads_line(heads: dict) -> str:
    """`serve --heads N`: who serves the port, and how often each head was started again."""
    parts = []
    for head in heads["heads"]:
        state = "serving" if head["alive"] and head["serving"] else "starting"
        if not head["alive"] and not head["serving"]:
            state = "down"
        restarts = f", {head['restarts']} restarts" if head["restarts"] else ""
        parts.append(f"{head['index']} {state} (pid {head['pid']}{restarts})")
    return (
        f"{heads['count']} on {heads['host']}:{heads['port']} (listener pid {heads['pid']}): "
        + "; ".join(parts)
    )


def register(sub) -> None:
    p = sub.add_parser("status", help="catalog, drives and capacity")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_status)
