"""`shingle quota set|list|remove|recount`: quotas of directory trees from a terminal.

Catalog-only, like the web UI's quota section: a change reaches the running daemon's next
write (it reads the quotas again after any commit it did not make itself)."""

from __future__ import annotations

import json

from appliance.cli.common import UsageError, load_config, size_arg
from appliance.runtime import open_catalog
from engine.admin.quota_service import QuotaInfo, QuotaService
from engine.base.units import format_size
from engine.namespace import Namespace

ACTOR = "cli"


def _limit(value: int | None, *, size: bool) -> str:
    if value is None:
        return "-"
    return format_size(value) if size else str(value)


def _show(q: QuotaInfo) -> str:
    return (
        f"{q.id:>3}  {q.path:<24} bytes {format_size(q.used_bytes)} / "
        f"{_limit(q.bytes_limit, size=True)} (soft {_limit(q.soft_bytes, size=True)})  "
        f"files {q.used_files} / {_limit(q.files_limit, size=False)} "
        f"(soft {_limit(q.soft_files, size=False)})"
    )


def cmd_quota(args) -> int:
    config = load_config(args)
    catalog = open_catalog(config)
    try:
        service = QuotaService(Namespace(catalog))  # catalog-only: no data path
        if args.action == "list":
            found = service.list()
            if args.json:
                print(json.dumps([q.to_dict() for q in found], indent=2))
            else:
                for quota in found:
                    print(_show(quota))
            return 0
        if args.action == "remove":
            service.remove(args.path, actor=ACTOR)
            print(f"quota on {args.path} removed")
            return 0
        if args.action == "recount":
            wrong = service.recount(fix=not args.check)
            for mismatch in wrong:
                print(mismatch)
            verb = "found wrong" if args.check else "corrected"
            print(f"{len(wrong)} quota counters {verb}")
            return 1 if wrong and args.check else 0
        limits = {
            "bytes_limit": args.bytes,
            "files_limit": args.files,
            "soft_bytes": args.soft_bytes,
            "soft_files": args.soft_files,
        }
        if all(v is None for v in limits.values()):
            raise UsageError("quota set: give --bytes, --files, --soft-bytes or --soft-files")
        print(_show(service.set(args.path, actor=ACTOR, **limits)))
        return 0
    finally:
        catalog.close()


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "quota", help="byte and file limits of directory trees (hard: EDQUOT; soft: an alert)"
    )
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    change = actions.add_parser(
        "set",
        help="set or change the quota of a directory (0 removes one limit)",
        epilog="example: shingle quota set /export/team --bytes 100GiB --soft-bytes 80GiB",
    )
    change.add_argument(
        "path", metavar="PATH", help="a namespace directory, or one under an export's name"
    )
    change.add_argument("--bytes", type=size_arg, help="hard limit of the files' sizes")
    change.add_argument("--files", type=_count, help="hard limit of the inodes below PATH")
    change.add_argument("--soft-bytes", type=size_arg, help="an alert past this size")
    change.add_argument("--soft-files", type=_count, help="an alert past this many inodes")
    listing = actions.add_parser("list", help="every quota with its usage")
    listing.add_argument("--json", action="store_true", help="print a JSON list")
    remove = actions.add_parser("remove", help="remove the quota of a directory (files stay)")
    remove.add_argument("path", metavar="PATH")
    recount = actions.add_parser(
        "recount", help="count every quota's tree again and correct the counters"
    )
    recount.add_argument(
        "--check", action="store_true", help="only report wrong counters (exit 1 if any)"
    )
    p.set_defaults(func=cmd_quota)
