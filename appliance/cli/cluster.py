"""`shingle cluster init|join|status|drain|remove|replace`: the hosts of a cluster.

init makes this head's config part of a cluster (etcd endpoints, a shared PostgreSQL catalog);
the others act on storage hosts, each running a drive agent (`shingle agent`). What moves data
(join's rebuild, drain, remove, replace) is a job: run here when no daemon owns the drives, else
by the daemon (in a cluster, its maintenance leader) while this command shows the progress. The
checks that can refuse (unknown host, a host that does not answer, too few hosts left for the
widest band class) run first, here, and change nothing when they refuse."""

from __future__ import annotations

import json
import re
import sys
import tomllib

from appliance import config as config_mod
from appliance.cli.common import Unreachable, UsageError, find_config, load_config
from appliance.cli.lifecycle import finish_job, run_data_job, with_catalog
from engine.base import errors
from engine.base.units import format_size

CLUSTER_HELP = """\
The hosts of a cluster: each storage host runs a drive agent (`shingle agent --listen
HOST:PORT --drives DIR...`); heads place every stripe's fragments over the hosts.

actions:
  plan --etcd NAME=ADDRESS,... --postgres NAME=ADDRESS,... [--plan FILE]
                    write the cluster's plan (default /etc/shingle/cluster.toml): its etcd
                    members and PostgreSQL members (under Patroni), their passwords, and the
                    cluster's CA and certificates (--tls-folder, default beside the plan)
  render [NAME] [--plan FILE] [--etc DIR]
                    on member NAME (default: the host name), write its etcd and Patroni
                    configs for Debian's etcd-server and patroni units; --catalog-url: print
                    the heads' catalog URL instead
  add-host NAME ADDRESS --role etcd|postgres|etcd,postgres [--plan FILE]
                    on the host that made the plan: NAME into the running cluster (its
                    certificate, `etcd member add` first), then prints the steps in order
  remove-host NAME [--plan FILE]
                    NAME out of etcd (`member remove`; refused if etcd would lose its quorum)
                    and the plan; a Patroni leader is refused (switch over first)
  init --etcd URLS | --plan FILE [--name NAME]
                    make this head's config part of a cluster: the maintenance leader is
                    elected through etcd (the catalog must be PostgreSQL, shared by the heads)
  join HOST:PORT    record an agent's drives, start using them, rebuild what lacks fragments
  status            hosts, their state, drives and fragments, how many may be lost, and the
                    progress and rate of a drain or rebuild under way
  drain HOST        move every fragment of HOST onto the other hosts (paced), then retire its
                    drives; refused when the others could not hold the widest stripe
  remove HOST       take HOST out of the pool: a drained (or empty) host at once, a host whose
                    agent does not answer is declared gone for good and its fragments rebuilt
                    from the other hosts; a host that answers and holds data: drain it first
  replace HOST HOST:PORT
                    join the new agent, then drain HOST (or remove it if it does not answer)

--rate MiB/s paces one job's writes (default: maintenance.rebuild_mib_s). A lost host is also
declared gone by itself after cluster.host_gone_after_s, when that is set.

examples:
  shingle cluster plan --etcd e1=10.0.0.11,e2=10.0.0.12,e3=10.0.0.13 \
      --postgres e1=10.0.0.11,e2=10.0.0.12,e3=10.0.0.13
  shingle cluster render e1
  shingle cluster join 10.0.0.21:7400
  shingle cluster status --json
  shingle cluster drain store-07 --rate 200
  shingle cluster remove store-03
  shingle cluster replace store-03 10.0.0.33:7400"""

ADDRESS = re.compile(r"^[A-Za-z0-9_.:\[\]-]+:\d{1,5}$")


def cmd_cluster(args) -> int:
    action = CLUSTER_ACTIONS[args.action]
    try:
        return action(args)
    except Unreachable as exc:
        print(f"shingle: {exc}", file=sys.stderr)
        return 1


def _need(value: str | None, usage: str) -> str:
    if not value:
        raise UsageError(f"cluster {usage}")
    return value


def _address(text: str | None, usage: str) -> str:
    address = _need(text, usage)
    if not ADDRESS.match(address):
        raise UsageError(f"{address!r}: expected an agent's HOST:PORT")
    return address


def _params(args, **params) -> dict:
    if args.rate is not None:
        if not args.rate > 0:
            raise UsageError(f"--rate {args.rate}: expected MiB/s above 0")
        params["rate_mib_s"] = args.rate
    return params


def _reach(address: str) -> dict:
    """The agent's HELLO, or a one-line error: the job would fail the same way later."""
    from engine.drives.remote import hello

    try:
        return hello(address)
    except OSError as exc:
        if isinstance(exc, errors.FsError):
            raise
        said = str(exc.strerror or exc)
        raise Unreachable(said if address in said else f"agent {address}: {said}") from None


def join(args) -> int:
    from engine.lifecycle.hostops import check_agent_geometry

    address = _address(args.host, "join HOST:PORT")
    served = _reach(address)
    check_agent_geometry(served, load_config(args).policies(), address)
    job = run_data_job(args, "host-join", _params(args, address=address))
    if args.json or job.state != "done" or not isinstance(job.result, dict):
        return finish_job(job, args.json)
    added = job.result.get("drives_added") or []
    print(
        f"{len(added)} drives of agent {address} (host {served.get('host') or address}) recorded"
        + (f" (ids {', '.join(map(str, added))})" if added else " (all known already)")
        + f"; rebuild: {job.result.get('fragments_rebuilt', 0)} fragments"
    )
    return 0


def drain(args) -> int:
    from engine.lifecycle.hostops import start_drain_host

    host = _need(args.host, "drain HOST")
    params = _params(args, host=host)
    with_catalog(
        args,
        lambda config, catalog: start_drain_host(catalog, host, config.policies(), actor="cli"),
    )
    return finish_job(run_data_job(args, "host-drain", params), args.json)


def remove(args) -> int:
    from engine.lifecycle.hostops import start_remove_host

    host = _need(args.host, "remove HOST")
    params = _params(args, host=host)
    with_catalog(
        args,
        lambda config, catalog: start_remove_host(catalog, host, config.policies(), actor="cli"),
    )
    return finish_job(run_data_job(args, "host-remove", params), args.json)


def replace(args) -> int:
    from engine.lifecycle.hostops import resolve_host_in

    old = _need(args.host, "replace HOST HOST:PORT")
    address = _address(args.address, "replace HOST HOST:PORT")
    params = _params(args, host=old, address=address)
    with_catalog(args, lambda config, catalog: catalog.read(lambda c: resolve_host_in(c, old)))
    _reach(address)
    return finish_job(run_data_job(args, "host-replace", params), args.json)


def status(args) -> int:
    from engine.admin import hosts

    def read(config, catalog):
        return hosts.cluster(catalog, *hosts.stripe_shape(config.policies()))

    view = with_catalog(args, read)
    if args.json:
        print(json.dumps(view.to_dict(), indent=2, sort_keys=True, default=str))
        return 0
    print(f"hosts     {len(view.hosts)}; may lose {view.may_lose} without losing data")
    for host in view.hosts:
        print(
            f"  {host.name:<16} {host.state:<9} {len(host.drives):>3} drives "
            f"({host.drives_readable} readable)  {host.fragments:>7} fragments "
            f"{format_size(host.fragment_bytes):>10}  {host.address or ''}"
        )
        if host.waiting_fragments:
            print(f"    {format_size(host.waiting_bytes)} to move or rebuild off it")
        work = view.operation(host)
        if work:
            print(
                f"    {work['kind']} job {work['job']} {work['state']}: "
                f"{format_size(work['done_bytes'])} of {format_size(work['total_bytes'])} at "
                f"{work['mb_per_s']:.1f} MB/s"
            )
    return 0


def init(args) -> int:
    """Write [cluster] etcd_endpoints (and name) into this head's config, once etcd answers
    and the catalog is one the heads can share."""
    from appliance.cli.clustersetup import plan_endpoints
    from appliance.runtime import open_catalog
    from engine.admin.events import record
    from engine.cluster.etcd import EtcdClient, EtcdError, check_endpoint, tls_context

    path = find_config(args.config)
    config = load_config(args)
    planned, tls = plan_endpoints(args)
    args.etcd = args.etcd or planned
    if not args.etcd:
        raise UsageError(
            "cluster init --etcd http://HOST:2379[,http://HOST:2379...] (or --plan FILE)"
        )
    try:
        endpoints = [check_endpoint(url) for url in config_mod.etcd_endpoints(args.etcd)]
    except ValueError:
        endpoints = []
    if not endpoints:
        raise UsageError(f"--etcd {args.etcd!r}: expected comma-separated http://HOST:PORT URLs")
    if any(url.startswith("https:") for url in endpoints) and not tls:
        raise UsageError("https etcd endpoints: take them from the plan (--plan FILE), which "
                         "names the cluster's CA and client certificate")  # fmt: skip
    if config.catalog_url.startswith("sqlite"):
        raise UsageError(
            "this head's catalog is SQLite, which one process on one host uses: a cluster's "
            "heads share a PostgreSQL catalog (catalog.url, see docs/cluster.md)"
        )
    try:
        context = tls_context(*tls.values()) if tls else None
        EtcdClient(endpoints, timeout_s=5, tls=context).get("/shingle/maintenance-leader")
    except (EtcdError, OSError) as exc:
        raise Unreachable(f"etcd at {', '.join(endpoints)} does not answer: {exc}") from None
    values = {"etcd_endpoints": ",".join(endpoints), **tls}
    if args.name:
        values["name"] = args.name
    text = set_section_options(path.read_text(), "cluster", values)
    config_mod.from_dict(tomllib.loads(text), path)  # refuse what would not load
    path.write_text(text)
    catalog = open_catalog(config)
    try:
        record(
            catalog,
            "cluster.init",
            f"head {args.name or '(host name)'} joined the cluster of etcd {', '.join(endpoints)}",
            actor="cli",
            details=values,
        )
    finally:
        catalog.close()
    print(
        f"{path}: [cluster] etcd_endpoints = {values['etcd_endpoints']}"
        + (f", name = {args.name}" if args.name else "")
        + "; restart the daemon to campaign for the maintenance leader"
    )
    return 0


def set_section_options(text: str, section: str, values: dict[str, str]) -> str:
    """``text`` (TOML) with each ``key = value`` of ``values`` set in ``[section]``: a line
    setting it (or the sample's commented default) replaced, else added under the header,
    else the section added at the end."""
    lines = text.splitlines()
    left = dict(values)
    start = next((i for i, line in enumerate(lines) if line.strip() == f"[{section}]"), None)
    if start is None:
        lines += ["", f"[{section}]"]
        start = len(lines) - 1
    end = next(
        (i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("[")), len(lines)
    )
    for i in range(start + 1, end):
        match = re.match(r"^\s*#?\s*([A-Za-z_]+)\s*=", lines[i])
        if match and match.group(1) in left:
            key = match.group(1)
            lines[i] = f"{key} = {json.dumps(left.pop(key))}"
    lines[start + 1 : start + 1] = [f"{key} = {json.dumps(value)}" for key, value in left.items()]
    return "\n".join(lines) + "\n"


def plan(args) -> int:
    from appliance.cli.clustersetup import plan as write_plan

    return write_plan(args)


def render(args) -> int:
    from appliance.cli.clustersetup import render as write_member

    return write_member(args)


def add_host(args) -> int:
    from appliance.cli.clustersetup import add_host as add

    return add(args)


def remove_host(args) -> int:
    from appliance.cli.clustersetup import remove_host as remove_member

    return remove_member(args)


CLUSTER_ACTIONS = {
    "plan": plan,
    "render": render,
    "add-host": add_host,
    "remove-host": remove_host,
    "init": init,
    "join": join,
    "status": status,
    "drain": drain,
    "remove": remove,
    "replace": replace,
}


def register(sub) -> None:
    import argparse

    p = sub.add_parser(
        "cluster",
        help="a cluster's hosts: plan, render, add-host, remove-host, init, join, status, "
        "drain, remove, replace",
        description=CLUSTER_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("action", choices=list(CLUSTER_ACTIONS))
    p.add_argument("host", nargs="?", help="a host's name (join: the agent's HOST:PORT)")
    p.add_argument(
        "address", nargs="?", help="replace: the new agent's HOST:PORT; add-host: its address"
    )
    p.add_argument("--etcd", help="init: etcd client URLs, comma-separated; plan: NAME=ADDRESS,...")
    p.add_argument("--postgres", help="plan: the PostgreSQL members, NAME=ADDRESS,...")
    p.add_argument("--plan", help="plan, render, init: the plan file (/etc/shingle/cluster.toml)")
    p.add_argument("--etcd-data-dir", help="plan: each etcd member's data folder")
    p.add_argument("--postgres-folder", help="plan: each PostgreSQL member's folder")
    p.add_argument("--etc", help="render: where the configs go (default /etc)")
    p.add_argument("--role", help="add-host: etcd, postgres or etcd,postgres")
    p.add_argument("--tls-folder", help="plan: the CA and certificates (beside the plan)")
    p.add_argument("--catalog-url", action="store_true", help="render: print the catalog URL")
    p.add_argument("--name", help="init: this head's name (default: the host name)")
    p.add_argument("--rate", type=float, help="MiB/s for this job's writes")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_cluster)
