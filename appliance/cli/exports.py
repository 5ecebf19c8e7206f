"""`shingle exports list|add|set|remove`: NFS exports from a terminal.

Changes go through engine.admin.exports, as the web UI's do: one catalog transaction
with an event (actor "cli"). The running daemon reloads its export table every
few seconds, so clients see a change without a restart."""

from __future__ import annotations

import argparse
import json

from appliance.cli.common import UsageError, load_config
from appliance.runtime import open_catalog
from engine.admin import exports as export_service
from engine.namespace import Namespace

ACTOR = "cli"


def _values(args) -> dict:
    """The export fields an `add` or `set` gives."""
    values: dict = {}
    if args.name is not None:
        values["name"] = args.name
    if getattr(args, "path", None) is not None:
        values["path"] = args.path
    if args.clients:
        values["clients"] = ",".join(args.clients)
    if args.squash is not None:
        values["squash"] = args.squash
    if args.sec is not None:
        values["sec"] = args.sec
    if args.access is not None:
        values["access"] = args.access
    for field in ("anon_uid", "anon_gid", "trash_days", "enabled", "delegations"):
        if getattr(args, field) is not None:
            values[field] = getattr(args, field)
    return values


def _show(export: export_service.Export) -> str:
    state = "" if export.enabled else "  (disabled)"
    return (
        f"{export.id:>3}  {export.name:<20} {export.path:<20} {export.access}  "
        f"{export.squash:<14} sec={export.sec:<18} {export.clients}{state}"
    )


def cmd_exports(args) -> int:
    config = load_config(args)
    catalog = open_catalog(config)
    try:
        if args.action == "list":
            found = export_service.list_exports(catalog)
            if args.json:
                print(json.dumps([e.to_dict() for e in found], indent=2))
            else:
                for export in found:
                    print(_show(export))
            return 0
        if args.action == "remove":
            export_service.delete(catalog, args.id, actor=ACTOR)
            print(f"export {args.id} removed")
            return 0
        namespace = Namespace(catalog)  # paths are checked against the namespace; no data path
        if args.action == "own-folder":
            export = export_service.get(catalog, args.id)
            export_service.own_folder(namespace, export)
            folder = namespace.resolve(export.path)
            print(
                f"export {export.id} ({export.name}): {export.path} is now owned by "
                f"{export.anon_uid}:{export.anon_gid}, mode {folder.mode & 0o7777:o}"
            )
            return 0
        try:
            if args.action == "add":
                values = _values(args)
                values.setdefault("name", args.path)
                export = export_service.create(catalog, values, actor=ACTOR, namespace=namespace)
            else:
                values = _values(args)
                if not values:
                    raise UsageError(
                        "exports set: nothing to change: give --squash, --sec, --clients, "
                        "--read-only, ... (see `shingle exports set --help`)"
                    )
                export = export_service.update(
                    catalog, args.id, values, actor=ACTOR, namespace=namespace
                )
        except export_service.ExportValueError as exc:
            raise UsageError(str(exc)) from None
        print(_show(export))
        return 0
    finally:
        catalog.close()


def _change_options(p, *, new: bool) -> None:
    p.add_argument("--name", help="the path clients mount" + (" (default: PATH)" if new else ""))
    p.add_argument(
        "--clients",
        nargs="+",
        metavar="CIDR",
        help="addresses or CIDRs allowed to mount" + (" (default: any)" if new else ""),
    )
    p.add_argument(
        "--squash",
        choices=export_service.SQUASH_MODES,
        help="identity mapping" + (" (default: root_squash)" if new else ""),
    )
    p.add_argument(
        "--sec",
        metavar="FLAVOURS",
        help="security flavours in order of preference, e.g. krb5p:krb5i:krb5 (sys, krb5, "
        "krb5i, krb5p; Kerberos needs nfs.krb5_keytab)" + (" (default: sys)" if new else ""),
    )
    access = p.add_mutually_exclusive_group()
    access.add_argument("--read-only", dest="access", action="store_const", const="ro")
    access.add_argument("--read-write", dest="access", action="store_const", const="rw")
    p.add_argument("--anon-uid", type=int, help="uid squashed users get (default 65534)")
    p.add_argument("--anon-gid", type=int, help="gid squashed users get (default 65534)")
    p.add_argument("--trash-days", type=int, help="days deleted entries stay in the trash")
    enabled = p.add_mutually_exclusive_group()
    enabled.add_argument("--enable", dest="enabled", action="store_const", const=True)
    enabled.add_argument(
        "--disable",
        dest="enabled",
        action="store_const",
        const=False,
        help="clients may not mount it",
    )
    p.add_argument(
        "--delegations",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="NFSv4 read delegations of its files (default: on)",
    )


def register(subparsers) -> None:
    p = subparsers.add_parser("exports", help="list, add, change or remove NFS exports")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="every export")
    listing.add_argument("--json", action="store_true", help="print a JSON list")
    add = actions.add_parser("add", help="export a namespace directory")
    add.add_argument("path", metavar="PATH", help="the namespace directory, e.g. /datasets")
    _change_options(add, new=True)
    change = actions.add_parser("set", help="change fields of one export")
    change.add_argument("id", type=int, metavar="ID")
    change.add_argument("--path", help="another namespace directory")
    _change_options(change, new=False)
    own = actions.add_parser(
        "own-folder",
        help="give the export's folder to its anonymous user, and the sticky bit back if it is "
        "world-writable (`shingle doctor` says when: root clients of a root_squash export cannot "
        "open new files in a sticky folder someone else owns, or anyone may remove others' "
        "files)",
    )
    own.add_argument("id", type=int, metavar="ID")
    remove = actions.add_parser("remove", help="remove one export (the files stay)")
    remove.add_argument("id", type=int, metavar="ID")
    p.set_defaults(func=cmd_exports)
