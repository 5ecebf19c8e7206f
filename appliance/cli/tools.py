"""`shingle fsck`, `shingle bench` and `shingle config`: checking the catalog, running a
benchmark, printing or checking a config."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from appliance import config as config_mod
from appliance.cli.common import UsageError, load_config

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"


def cmd_fsck(args) -> int:
    from appliance.runtime import open_catalog
    from engine.admin.fsck import check
    from engine.namespace import ROOT_INO_KEY

    config = load_config(args)
    catalog = open_catalog(config)
    try:
        root_ino = catalog.get_setting(ROOT_INO_KEY, "1")
        assert root_ino is not None  # the default
        report = check(catalog, int(root_ino))
    finally:
        catalog.close()
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print(
            f"{report.inodes} inodes, {report.dirents} entries, {report.extents} extents: "
            f"{'clean' if report.clean else f'{len(report.problems)} problems'}"
        )
        for problem in report.problems:
            print(f"  {problem}")
    return 0 if report.clean else 1


def cmd_bench(args) -> int:
    """Benchmarks live in the source tree's bench/ (they are not installed)."""
    available = (
        sorted(p.stem for p in BENCH_DIR.glob("*.py") if not p.stem.startswith("_"))
        if BENCH_DIR.is_dir()
        else []
    )
    if args.name not in available:
        raise UsageError(
            f"benchmark {args.name!r}: expected one of "
            f"{', '.join(available) or '(none: not a source checkout)'}"
        )
    return subprocess.call([sys.executable, str(BENCH_DIR / f"{args.name}.py"), *args.bench_args])


def cmd_config(args) -> int:
    if args.action == "sample":
        print(config_mod.render())
        return 0
    config = load_config(args)
    print(f"{config.path}: valid")
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "fsck", help="check the catalog's consistency (read-only); exit 1 on problems"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_fsck)

    p = sub.add_parser(
        "bench", help="run a benchmark from bench/ (catalog, engine, nfs, compare, ...)"
    )
    p.add_argument("name")
    p.add_argument("bench_args", nargs=argparse.REMAINDER, help="arguments for the benchmark")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("config", help="print the documented sample config, or check a config file")
    p.add_argument("action", choices=["sample", "check"])
    p.set_defaults(func=cmd_config)
