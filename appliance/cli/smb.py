"""`shingle smb user add|list|remove|passwd` and `shingle smb share list|add|set|remove`.

Changes go through engine.admin.smb, as the web UI's do: one catalog transaction with an event
(actor "cli"); passwords go to Samba's passdb in DATA_DIR/smb (appliance/smb/samba.py). The running
daemon rewrites smb.conf from the catalog every few seconds, so a change reaches smbd without a
restart."""

from __future__ import annotations

import argparse
import json
import sys

from appliance.cli.common import UsageError, load_config
from appliance.runtime import open_catalog
from engine.admin import smb as smb_service
from engine.namespace import Namespace

ACTOR = "cli"


def _passdb(config, catalog):
    from appliance.smb.samba import SambaLayout, SambaPassdb

    return SambaPassdb(SambaLayout.for_data_dir(config.data_dir), catalog)


def _read_password(args) -> str:
    if not args.password_stdin:
        raise UsageError("give the password on standard input with --password-stdin")
    password = sys.stdin.readline().rstrip("\n")
    if not password:
        raise UsageError("--password-stdin: expected a password on the first line of stdin")
    return password


def _share_values(args) -> dict:
    values: dict = {}
    for field in ("name", "path", "access", "case_insensitive", "guest", "enabled"):
        if getattr(args, field, None) is not None:
            values[field] = getattr(args, field)
    if args.clients:
        values["clients"] = ",".join(args.clients)
    if args.users is not None:
        values["users"] = ",".join(args.users)
    if args.read_only_users is not None:
        values["read_only_users"] = ",".join(args.read_only_users)
    return values


def _show_share(share: smb_service.Share) -> str:
    who = ("guests, " if share.guest else "") + (share.users or "every SMB user")
    extra = []
    if share.read_only_users:
        extra.append(f"read-only: {share.read_only_users}")
    if share.case_insensitive:
        extra.append("case-insensitive")
    if not share.enabled:
        extra.append("disabled")
    return (
        f"{share.id:>3}  {share.name:<16} {share.path:<20} {share.access}  {share.clients}  "
        f"{who}" + (f"  ({'; '.join(extra)})" if extra else "")
    )


def cmd_smb(args) -> int:
    config = load_config(args)
    catalog = open_catalog(config)
    try:
        if args.smb_kind == "user":
            return _users(args, config, catalog)
        return _shares(args, catalog)
    finally:
        catalog.close()


def _users(args, config, catalog) -> int:
    if args.action == "list":
        users = smb_service.list_users(catalog)
        if args.json:
            print(json.dumps([u.to_dict() for u in users], indent=2))
        for user in [] if args.json else users:
            print(f"{user.name:<20} uid {user.uid:<8} gid {user.gid}")
        return 0
    passdb = _passdb(config, catalog)
    if args.action == "add":
        user = smb_service.create_user(
            catalog,
            args.name,
            _read_password(args),
            passdb=passdb,
            actor=ACTOR,
            uid=args.uid,
            gid=args.gid,
        )
        print(f"SMB user {user.name} added (uid {user.uid}, gid {user.gid})")
    elif args.action == "passwd":
        smb_service.set_password(
            catalog, args.name, _read_password(args), passdb=passdb, actor=ACTOR
        )
        print(f"SMB user {args.name}: password changed")
    else:
        smb_service.delete_user(catalog, args.name, passdb=passdb, actor=ACTOR)
        print(f"SMB user {args.name} removed")
    return 0


def _ref(text: str) -> int | str:
    return int(text) if text.isdigit() else text


def _shares(args, catalog) -> int:
    if args.action == "list":
        shares = smb_service.list_shares(catalog)
        if args.json:
            print(json.dumps([s.to_dict() for s in shares], indent=2))
        for share in [] if args.json else shares:
            print(_show_share(share))
        return 0
    if args.action == "remove":
        smb_service.delete_share(catalog, _ref(args.share), actor=ACTOR)
        print(f"SMB share {args.share} removed")
        return 0
    namespace = Namespace(catalog)  # paths are checked against the namespace; no data path
    values = _share_values(args)
    if args.action == "add":
        share = smb_service.create_share(catalog, values, actor=ACTOR, namespace=namespace)
    else:
        if not values:
            raise UsageError("smb share set: give at least one field to change")
        share = smb_service.update_share(
            catalog, _ref(args.share), values, actor=ACTOR, namespace=namespace
        )
    print(_show_share(share))
    return 0


def _share_options(p: argparse.ArgumentParser, *, adding: bool) -> None:
    p.add_argument("--path", help="namespace directory to share (default /)" if adding else None)
    p.add_argument("--access", choices=smb_service.ACCESS_MODES)
    p.add_argument("--read-only", dest="access", action="store_const", const="ro")
    p.add_argument("--clients", nargs="+", metavar="CIDR", help="clients allowed (hosts allow)")
    p.add_argument(
        "--users",
        nargs="*",
        metavar="USER",
        help="SMB users who may connect (none given: every SMB user)",
    )
    p.add_argument(
        "--read-only-users",
        nargs="*",
        metavar="USER",
        help="SMB users who may connect but not write",
    )
    p.add_argument(
        "--guest",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="allow connections without a password (as nobody)",
    )
    p.add_argument(
        "--case-insensitive",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="names compared without case (a miss then scans the directory)",
    )
    p.add_argument("--enabled", action=argparse.BooleanOptionalAction, default=None)


def register(sub) -> None:
    p = sub.add_parser("smb", help="SMB users and shares (Samba over the local mount)")
    kinds = p.add_subparsers(dest="smb_kind", required=True, metavar="user|share")

    users = kinds.add_parser("user", help="SMB users (passwords go to Samba's passdb)")
    actions = users.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = actions.add_parser("list", help="SMB users and their uid/gid")
    q.add_argument("--json", action="store_true")
    q = actions.add_parser("add", help="a new SMB user; the password is read from stdin")
    q.add_argument("name")
    q.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    q.add_argument(
        "--uid", type=int, help=f"uid its files get (default: from {smb_service.FIRST_UID} up)"
    )
    q.add_argument("--gid", type=int, help="gid its files get (default: the uid)")
    q = actions.add_parser("passwd", help="set an SMB user's password (from stdin)")
    q.add_argument("name")
    q.add_argument("--password-stdin", action="store_true")
    q = actions.add_parser("remove", help="remove an SMB user")
    q.add_argument("name")

    shares = kinds.add_parser("share", help="SMB shares")
    actions = shares.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = actions.add_parser("list", help="SMB shares")
    q.add_argument("--json", action="store_true")
    q = actions.add_parser("add", help="share a namespace directory")
    q.add_argument("name", help="the share's name (//server/NAME)")
    _share_options(q, adding=True)
    q = actions.add_parser("set", help="change a share (by id or name)")
    q.add_argument("share")
    q.add_argument("--name", help="a new name")
    _share_options(q, adding=False)
    q = actions.add_parser("remove", help="remove a share (the files stay)")
    q.add_argument("share")
    p.set_defaults(func=cmd_smb)
