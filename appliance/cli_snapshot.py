"""`shingle snapshot create|list|delete|rollback|clone|diff`: versioned datasets from a terminal.

Snapshots change catalog rows only (a frozen copy of a tree's rows sharing its stripes; freed
stripes leave their zones to the data path's reclaim), so these commands work on the catalog
directly, whether or not a daemon runs: their transactions are not tracked ones, so the
daemon's caches (attributes, names, read-only ranges, settled sizes) read the catalog again at
their next use. A snapshot holds what was committed when it was taken."""

from __future__ import annotations

import json
import time

from appliance.cli import load_config
from appliance.config import format_size
from appliance.runtime import Appliance
from engine.snapshots import Snapshots


def _with_snapshots(args, work):
    appliance = Appliance(load_config(args), with_data=False)
    try:
        return work(Snapshots(appliance.namespace))
    finally:
        appliance.close()


def _when(ns: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ns / 1e9))


def cmd_snapshot(args) -> int:
    action = args.action
    if action == "create":
        info = _with_snapshots(args, lambda s: s.create(args.path, args.name))
        print(
            f"snapshot {info.name} of {args.path}: {info.files} inodes, "
            f"{format_size(info.referenced_bytes)} referenced"
        )
    elif action == "list":
        snapshots = _with_snapshots(args, lambda s: s.list(args.path))
        if args.json:
            print(json.dumps([s.to_dict() for s in snapshots], indent=2))
        else:
            for s in snapshots:
                print(
                    f"{s.name:<24} {_when(s.created)}  referenced "
                    f"{format_size(s.referenced_bytes):>10}  unique "
                    f"{format_size(s.unique_bytes):>10}  {s.files} inodes"
                )
    elif action == "delete":
        freed = _with_snapshots(args, lambda s: s.delete(args.path, args.name))
        print(f"deleted snapshot {args.name} of {args.path} ({freed} stripes freed)")
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
    q.add_argument("--json", action="store_true")
    q = actions.add_parser("delete", help="remove a snapshot (frees what only it references)")
    q.add_argument("path")
    q.add_argument("name")
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
    p.set_defaults(func=cmd_snapshot)
