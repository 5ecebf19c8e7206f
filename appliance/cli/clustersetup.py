"""`shingle cluster plan`, `render`, `add-host` and `remove-host`: etcd and PostgreSQL under
Patroni for a cluster, set up from one plan file with Debian's etcd-server and patroni packages
(appliance/host/clusterplan.py says what is rendered, clustertls.py the certificates;
docs/cluster.md the steps)."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

from appliance.cli.common import Unreachable, UsageError
from appliance.host import clusterplan, clustertls

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
    tls = Path(args.tls_folder) if args.tls_folder else path.parent / "cluster-tls"
    try:
        made = clusterplan.new_plan(args.etcd, args.postgres, tls_folder=str(tls), **options)
    except clusterplan.PlanError as exc:
        raise UsageError(str(exc)) from None
    if tls.exists() and any(tls.iterdir()):
        raise UsageError(f"{tls} holds files: a new CA would not match the members' certificates "
                         "(remove it first, or --tls-folder another)")  # fmt: skip
    members = {**made.etcd, **made.postgres}
    try:
        clustertls.make_ca(tls, made.name)
        for member, address in members.items():
            clustertls.make_cert(tls, member, [address])
        clustertls.make_cert(tls, clustertls.CLIENT, [])
    except clustertls.TlsError as exc:
        raise UsageError(str(exc)) from None
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(made.to_toml())
    print(
        f"{path}: etcd {', '.join(made.etcd)}; PostgreSQL {', '.join(made.postgres)}; the "
        f"cluster CA and each host's certificate in {tls}. Copy the plan and the folder (but "
        f"ca.key, which signs new hosts' certificates) to each of {', '.join(members)} (they "
        "hold passwords and keys: keep them 0600) and run `shingle cluster render NAME` there"
    )
    return 0


def _owned(path: Path, owner: str | None, mode: int) -> None:
    os.chmod(path, mode)
    if owner is not None and os.geteuid() == 0:
        user = pwd.getpwnam(owner)
        os.chown(path, user.pw_uid, user.pw_gid)


def _write(rendered: clusterplan.Rendered) -> None:
    """A rendered file with its mode from its first byte (a key is never readable by others,
    not even while it is written), then its owner."""
    if rendered.path.exists():
        os.chmod(rendered.path, rendered.mode & 0o700)
    fd = os.open(rendered.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, rendered.mode & 0o700)
    with os.fdopen(fd, "w") as out:
        out.write(rendered.text)
    _owned(rendered.path, rendered.owner, rendered.mode)


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
        _write(rendered)
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


def plan_endpoints(args) -> tuple[str | None, dict[str, str]]:
    """``cluster init --plan FILE``: the plan's etcd endpoints, comma-separated, and the
    [cluster] TLS options naming the plan's CA and client certificate (none without TLS)."""
    if not args.plan:
        return None, {}
    made = load(args)
    tls = made.client_tls()
    options = {} if tls is None else dict(zip(("etcd_ca_file", "etcd_cert_file",
                                               "etcd_key_file"), tls, strict=True))  # fmt: skip
    return ",".join(made.etcd_endpoints), options


def plan_etcd(made: clusterplan.Plan, timeout_s: float = 5.0):
    """An etcd client of the plan's members, with the plan's client certificate."""
    from engine.cluster.etcd import EtcdClient, tls_context

    tls = made.client_tls()
    try:
        context = tls_context(*tls) if tls else None
    except OSError as exc:
        raise UsageError(f"the plan's client certificate: {exc}") from None
    return EtcdClient(made.etcd_endpoints, timeout_s=timeout_s, tls=context)


def add_host(args) -> int:
    """A host into the running cluster: the plan gains it (and its certificate, signed by the
    CA here); as an etcd member it is added to etcd first (`member add`), so it must start
    next with initial-cluster-state existing, which its rendered file says."""
    from engine.cluster.etcd import EtcdError

    path = _plan_path(args)
    made = load(args)
    if not args.host or not args.address:
        raise UsageError("cluster add-host NAME ADDRESS --role etcd|postgres|etcd,postgres")
    roles = [r.strip() for r in (args.role or "").split(",") if r.strip()]
    try:
        clusterplan.add_member(made, args.host, args.address, roles)
    except clusterplan.PlanError as exc:
        raise UsageError(str(exc)) from None
    if made.tls_folder and not made.tls_file(f"{args.host}.crt").exists():
        if not made.tls_file("ca.key").exists():
            raise UsageError(f"{made.tls_file('ca.key')} is absent: add hosts on the host that "
                             "made the plan (it holds the CA's key)")  # fmt: skip
        try:
            clustertls.make_cert(Path(made.tls_folder), args.host, [args.address])
        except clustertls.TlsError as exc:
            raise UsageError(str(exc)) from None
    if "etcd" in roles:
        peer = f"{made.scheme}://{args.address}:{clusterplan.ETCD_PEER_PORT}"
        # the members as they were: the new one does not answer yet
        others = clusterplan.Plan(**{**made.__dict__, "etcd": {
            n: a for n, a in made.etcd.items() if n != args.host}})  # fmt: skip
        client = plan_etcd(others)
        try:
            if not any(peer in m.peer_urls for m in client.members()):  # not added by a rerun
                client.add_member(peer)
        except EtcdError as exc:
            raise Unreachable(f"etcd refused the new member {args.host} ({peer}): "
                              f"{_quorum_said(exc)}") from None  # fmt: skip
    clusterplan.write_plan(made, path)
    print(f"{path}: {args.host} ({args.address}) added as {' and '.join(roles)}")
    steps = [f"copy {path} and {made.tls_folder or 'nothing else'} to {args.host}"]
    if "postgres" in roles:
        # the members' pg_hba must let the new one replicate before it asks for its base backup
        steps.append("on every other PostgreSQL member: shingle cluster render NAME; "
                     "systemctl reload patroni")  # fmt: skip
    steps.append(f"on {args.host}: shingle cluster render {args.host}")
    if "etcd" in roles:
        steps.append(f"on {args.host}: systemctl restart etcd   # now: etcd counts it in its "
                     "quorum from this moment")  # fmt: skip
    if "postgres" in roles:
        steps.append(f"on {args.host}: systemctl enable --now patroni   # joins as a replica")
    steps.append("on every other member: shingle cluster render NAME (the lists of members)")
    steps.append("on each head: shingle cluster init --plan FILE (etcd endpoints); catalog.url ="
                 " `shingle cluster render --catalog-url`")  # fmt: skip
    for number, step in enumerate(steps, start=1):
        print(f"  {number}. {step}")
    return 0


def remove_host(args) -> int:
    """A host out of the running cluster: as an etcd member it leaves etcd first (`member
    remove`, which etcd refuses when the rest would lose its quorum), then the plan; a Patroni
    leader is refused (switch over first)."""
    from engine.cluster.etcd import EtcdError, EtcdRequestRefused

    path = _plan_path(args)
    made = load(args)
    if not args.host:
        raise UsageError("cluster remove-host NAME")
    roles = made.roles(args.host)
    if not roles:
        raise UsageError(f"{args.host!r} is no member of the plan (storage hosts leave by "
                         "`shingle cluster drain` or `remove`)")  # fmt: skip
    if "postgres" in roles and _patroni_leader(made) == args.host:
        raise UsageError(f"{args.host} is the Patroni leader: switch over first (patronictl -c "
                         "/etc/patroni/config.yml switchover), then remove it")  # fmt: skip
    address = made.address(args.host)
    try:
        clusterplan.remove_member(made, args.host)
    except clusterplan.PlanError as exc:
        raise UsageError(str(exc)) from None
    if "etcd" in roles:
        peer = f"{made.scheme}://{address}:{clusterplan.ETCD_PEER_PORT}"
        client = plan_etcd(made)  # the members that stay answer
        try:
            found = [m for m in client.members() if m.name == args.host or peer in m.peer_urls]
            for member in found:
                client.remove_member(member.id)
        except EtcdRequestRefused as exc:
            raise UsageError(f"etcd refused to remove {args.host}: {exc}") from None
        except EtcdError as exc:
            raise Unreachable(f"etcd refused to remove {args.host}: {_quorum_said(exc)}") from None
    clusterplan.write_plan(made, path)
    print(f"{path}: {args.host} removed ({' and '.join(roles)})")
    steps = []
    if "etcd" in roles:
        steps.append(f"on {args.host}: systemctl disable --now etcd; remove {made.etcd_data_dir} "
                     "(a removed member cannot come back on its old data)")  # fmt: skip
    if "postgres" in roles:
        steps.append(f"on {args.host}: systemctl disable --now patroni (its member key "
                     "expires, the leader drops its slot)")  # fmt: skip
    steps.append("on every other member: shingle cluster render NAME; systemctl reload patroni")
    steps.append("on each head: shingle cluster init --plan FILE; catalog.url = `shingle "
                 "cluster render --catalog-url`")  # fmt: skip
    steps.append(
        f"if {args.host} also runs a drive agent: shingle cluster drain {args.host} "
        "(its fragments move to the other hosts), or remove it if it is lost"
    )
    for number, step in enumerate(steps, start=1):
        print(f"  {number}. {step}")
    return 0


def _quorum_said(exc: Exception) -> str:
    # etcd's strict reconfiguration check answers UNAVAILABLE "unhealthy cluster" when the
    # members started after the change would be fewer than its quorum
    if "unhealthy cluster" in str(exc):
        return ("the members started after the change would be fewer than a quorum (etcd: "
                "unhealthy cluster): start the members that are down first")  # fmt: skip
    return str(exc)


def _patroni_leader(made: clusterplan.Plan) -> str | None:
    from appliance.host.clusterdoctor import patroni_members

    members = patroni_members(made)
    return next((m["name"] for m in members or [] if m.get("role") == "leader"), None)
