"""`shingle doctor` on a host holding the cluster's plan (/etc/shingle/cluster.toml,
appliance/host/clusterplan.py): the plan itself, this host's rendered files, the etcd members
and the Patroni cluster as they answer now, and a head's catalog URL against the plan."""

from __future__ import annotations

import json
import os
import pwd
import urllib.request
from pathlib import Path

from sqlalchemy import make_url

from appliance.host import clusterplan
from appliance.host.checks import Check

TIMEOUT_S = 2.0


# the members are on the cluster's private network: never through an http_proxy of the shell
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _get_json(url: str):
    with _DIRECT.open(url, timeout=TIMEOUT_S) as reply:
        return json.loads(reply.read())


def check_plan_file(path: Path) -> Check:
    if path.stat().st_mode & 0o077:
        return Check(
            "cluster plan", "warn", f"{path} is readable by others: it holds the passwords",
            f"chmod 600 {path}",
        )  # fmt: skip
    return Check("cluster plan", "ok", f"{path}")


def check_rendered(plan: clusterplan.Plan, member: str, etc: Path) -> list[Check]:
    """This member's files as `shingle cluster render` writes them, and its data folders."""
    results = []
    fix = f"shingle cluster render {member}"
    for rendered in clusterplan.render(plan, member, etc):
        name = f"cluster {rendered.path.parent.name}/{rendered.path.name}"
        try:
            text = rendered.path.read_text()
        except OSError as exc:
            results.append(Check(name, "fail", f"{rendered.path}: {exc.strerror}", fix))
            continue
        if text != rendered.text:
            results.append(
                Check(name, "warn", f"{rendered.path} differs from the plan's", fix + " again")
            )
        else:
            results.append(Check(name, "ok", f"{rendered.path} as the plan renders it"))
    roles = plan.roles(member)
    folders = [(Path(plan.etcd_data_dir), "etcd")] if "etcd" in roles else []
    folders += [(Path(plan.postgres_folder), "postgres")] if "postgres" in roles else []
    for folder, owner in folders:
        try:
            found = pwd.getpwuid(os.stat(folder).st_uid).pw_name
        except (OSError, KeyError):
            found = None
        if found != owner:
            detail = f"{folder}: " + ("absent" if found is None else f"owned by {found}")
            results.append(Check(f"cluster {owner} folder", "fail", detail, fix))
    return results


def check_etcd(plan: clusterplan.Plan) -> Check:
    healthy: list[str] = []
    down: list[str] = []
    for name, endpoint in zip(plan.etcd, plan.etcd_endpoints, strict=True):
        try:
            ok = _get_json(f"{endpoint}/health").get("health") == "true"
        except (OSError, ValueError):
            ok = False
        (healthy if ok else down).append(name)
    detail = f"{len(healthy)} of {len(plan.etcd)} members healthy"
    if down:
        detail += f" ({', '.join(down)} not)"
    if len(healthy) <= len(plan.etcd) // 2:
        return Check("cluster etcd", "fail", detail + ": no quorum", "systemctl start etcd there")
    return Check("cluster etcd", "warn" if down else "ok", detail)


def check_patroni(plan: clusterplan.Plan) -> Check:
    members = None
    for address in plan.postgres.values():
        try:
            members = _get_json(f"http://{address}:{clusterplan.PATRONI_PORT}/cluster")["members"]
            break
        except (OSError, ValueError, KeyError):
            continue
    if members is None:
        return Check(
            "cluster patroni", "fail", "no Patroni member answers", "systemctl start patroni"
        )
    running = {m["role"]: m["name"] for m in members if m.get("state") in ("running", "streaming")}
    detail = ", ".join(f"{m['name']} {m['role']} {m.get('state')}" for m in members)
    if "leader" not in running:
        return Check("cluster patroni", "fail", f"no primary: {detail}")
    if "sync_standby" not in running or len(members) < len(plan.postgres):
        return Check("cluster patroni", "warn", detail, "every member of the plan running")
    return Check("cluster patroni", "ok", detail)


def check_catalog_url(plan: clusterplan.Plan, url: str) -> Check | None:
    """A head's catalog.url against the plan: every PostgreSQL member, and no other host."""
    if not url.startswith("postgresql"):
        return None
    parsed = make_url(url)
    hosts = parsed.query.get("host") or parsed.host or ""
    named = {h.rsplit(":", 1)[0] for h in ([hosts] if isinstance(hosts, str) else hosts)}
    planned = set(plan.postgres.values())
    if named != planned:
        return Check(
            "cluster catalog url", "warn",
            f"catalog.url names {', '.join(sorted(named))}; the plan's members are "
            f"{', '.join(sorted(planned))}",
            "catalog.url = `shingle cluster render --catalog-url`",
        )  # fmt: skip
    return Check("cluster catalog url", "ok", "catalog.url names every PostgreSQL member")


def check_cluster(
    plan_path: Path, etc: Path, member: str | None, catalog_url: str | None = None
) -> list[Check]:
    """Every check of a host with the plan ``plan_path`` (``member``: this host's name)."""
    try:
        plan = clusterplan.load_plan(plan_path)
    except clusterplan.PlanError as exc:
        return [Check("cluster plan", "fail", str(exc), "shingle cluster plan")]
    results = [check_plan_file(plan_path)]
    if member is not None and plan.roles(member):
        results += check_rendered(plan, member, etc)
    results += [check_etcd(plan), check_patroni(plan)]
    if catalog_url is not None and (url_check := check_catalog_url(plan, catalog_url)):
        results.append(url_check)
    return results
