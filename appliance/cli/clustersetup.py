"""`shingle cluster plan` and `shingle cluster render`: etcd and PostgreSQL under Patroni for
a cluster, set up from one plan file with Debian's etcd-server and patroni packages
(appliance/host/clusterplan.py says what is rendered; docs/cluster.md the steps)."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

from appliance.cli.common import UsageError
from appliance.host import clusterplan

DEFAULT_PLAN = Path("/etc/shingle/cluster.toml")


def _plan_path(args) -> Path:
    return Path(args.plan) if args.plan else DEFAULT_PLAN


def load(args) -> clusterplan.Plan:
    try:
        return clusterplan.load_plan(_plan_path(args))
    except clusterplan.PlanError as exc:
        raise UsageError(str(exc)) from None


def plan(args) -> int:
    """Write a new plan: the members, and passwords made here (never overwrites one)."""
    path = _plan_path(args)
    if not args.etcd or not args.postgres:
        raise UsageError(
            "cluster plan --etcd NAME=ADDRESS,... --postgres NAME=ADDRESS,... [--plan FILE]"
        )
    if path.exists():
        raise UsageError(
            f"{path} exists: a new plan would change the cluster's passwords (remove it first, "
            "or --plan another file)"
        )
    options = {}
    if args.etcd_data_dir:
        options["etcd_data_dir"] = args.etcd_data_dir
    if args.postgres_folder:
        options["postgres_folder"] = args.postgres_folder
    try:
        made = clusterplan.new_plan(args.etcd, args.postgres, **options)
    except clusterplan.PlanError as exc:
        raise UsageError(str(exc)) from None
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(made.to_toml())
    members = dict.fromkeys([*made.etcd, *made.postgres])
    print(
        f"{path}: etcd {', '.join(made.etcd)}; PostgreSQL {', '.join(made.postgres)}. Copy it "
        f"to each of {', '.join(members)} (it holds passwords: keep it 0600) and run "
        "`shingle cluster render NAME` there"
    )
    return 0


def _owned(path: Path, owner: str | None, mode: int) -> None:
    os.chmod(path, mode)
    if owner is not None and os.geteuid() == 0:
        user = pwd.getpwnam(owner)
        os.chown(path, user.pw_uid, user.pw_gid)


def _folder(path: Path, owner: str) -> None:
    """A member's data folder: made (0700, the service user's) when absent, left as it is
    otherwise (a member re-rendered keeps its data)."""
    if path.exists():
        return
    path.mkdir(parents=True, mode=0o700)
    _owned(path, owner, 0o700)


def render(args) -> int:
    """Write this host's files of the plan (its etcd member, its PostgreSQL member)."""
    made = load(args)
    if args.catalog_url:
        print(made.catalog_url)
        return 0
    member = args.host or os.uname().nodename.split(".")[0]
    etc = Path(args.etc) if args.etc else Path("/etc")
    try:
        files = clusterplan.render(made, member, etc)
    except clusterplan.PlanError as exc:
        raise UsageError(str(exc)) from None
    for rendered in files:
        rendered.path.parent.mkdir(parents=True, exist_ok=True)
        rendered.path.write_text(rendered.text)
        _owned(rendered.path, rendered.owner, rendered.mode)
        print(f"wrote {rendered.path}")
    roles = made.roles(member)
    steps = []
    if "etcd" in roles:
        _folder(Path(made.etcd_data_dir), "etcd")
        steps.append("systemctl restart etcd      # etcd-server's unit reads /etc/default/etcd")
    if "postgres" in roles:
        _folder(Path(made.postgres_folder), "postgres")
        steps.append("systemctl enable --now patroni   # patroni's unit, /etc/patroni/config.yml")
    print("then, on every member at about the same time (etcd waits for a quorum):")
    for step in steps:
        print(f"    {step}")
    print(
        "and on each head: shingle cluster init --plan FILE (etcd); its catalog URL is "
        "`shingle cluster render --catalog-url`"
    )
    return 0


def plan_endpoints(args) -> str | None:
    """``cluster init --plan FILE``: the plan's etcd endpoints, comma-separated."""
    if not args.plan:
        return None
    return ",".join(load(args).etcd_endpoints)
