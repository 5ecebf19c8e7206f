"""`shingle doctor` on a host holding the cluster's plan (/etc/shingle/cluster.toml,
appliance/host/clusterplan.py): the plan itself, this host's rendered files, its certificates
(the CA's, its own, the clients'), the etcd members (quorum, the member list against the plan)
and the Patroni cluster (a primary, a synchronous standby, replication lag) as they answer now,
the clocks of the members against this host's, and a head's catalog URL against the plan."""

from __future__ import annotations

import datetime
import email.utils
import json
import os
import pwd
import ssl
import time
import urllib.parse
import urllib.request
from pathlib import Path

from sqlalchemy import make_url

from appliance.host import clusterplan, clustertls
from appliance.host.checks import Check

TIMEOUT_S = 2.0
CERT_WARN_DAYS = 30
# clocks: HTTP's Date has whole seconds, so a skew under 2 s cannot be told from none; past 5
# minutes Kerberos (sec=krb5) refuses tickets outright
SKEW_WARN_S = 2.0
SKEW_FAIL_S = 300.0


def _opener(plan: clusterplan.Plan | None = None) -> urllib.request.OpenerDirector:
    # the members are on the cluster's private network: never through an http_proxy of the
    # shell; https with the cluster's CA and the plan's client certificate
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    tls = plan.client_tls() if plan is not None else None
    if tls is not None:
        from engine.cluster.etcd import tls_context

        handlers.append(urllib.request.HTTPSHandler(context=tls_context(*tls)))
    return urllib.request.build_opener(*handlers)


_DIRECT = _opener()


def _get_json(url: str, opener: urllib.request.OpenerDirector = _DIRECT, body=None, skews=None):
    """The JSON at ``url`` (POST ``body`` when given); with ``skews`` (a dict), the answering
    host's clock against ours from its Date header, under the URL's host."""
    data = None if body is None else json.dumps(body).encode()
    sent = time.time()
    with opener.open(urllib.request.Request(url, data=data), timeout=TIMEOUT_S) as reply:
        answer = json.loads(reply.read())
        date = reply.headers.get("Date")
    if skews is not None and date:
        middle = (sent + time.time()) / 2
        # Date is the server's second, truncated: its clock read half a second more on average
        skews[urllib.parse.urlsplit(url).hostname] = (
            email.utils.parsedate_to_datetime(date).timestamp() + 0.5 - middle
        )
    return answer


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
        name = f"cluster {rendered.path.relative_to(etc).as_posix()}"
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


def check_certificates(plan: clusterplan.Plan, member: str | None) -> list[Check]:
    """The plan's CA, this member's certificate and the clients' one: readable, signed by the
    CA, within their dates (warn CERT_WARN_DAYS before the end), naming this member's address
    (etcd's peers and clients check it), and each with its own key."""
    if not plan.tls_folder:
        said = "the plan has no [tls]: etcd speaks plain HTTP, unauthenticated"
        return [Check("cluster tls", "warn", said, "a new plan (shingle cluster plan) makes a CA")]
    now = datetime.datetime.now(datetime.UTC)
    ca = plan.tls_file("ca.crt")
    wanted: list[tuple[str, Path, str | None]] = [("ca", ca, None)]
    if member is not None and plan.roles(member):
        wanted.append((member, plan.tls_file(f"{member}.crt"), plan.address(member)))
    wanted.append((clustertls.CLIENT, plan.tls_file(f"{clustertls.CLIENT}.crt"), None))
    results = []
    for name, cert, address in wanted:
        check = f"cluster tls {name}"
        if name == "ca":
            try:
                facts: clustertls.CertFacts | None = clustertls.ca_facts(cert)
            except (OSError, KeyError, ValueError) as exc:
                results.append(Check(check, "fail", f"{cert}: unreadable ({exc})",
                                     "copy the plan's TLS folder to this host"))  # fmt: skip
                continue
            problem = None
        else:
            facts, problem = clustertls.inspect(ca, cert, cert.with_suffix(".key"))
        if facts is None:
            results.append(Check(check, "fail", f"{cert}: {problem}", _renew(name)))
            continue
        left = facts.not_after - now
        if left.total_seconds() <= 0:
            results.append(Check(check, "fail", f"{cert} expired {facts.not_after:%Y-%m-%d}",
                                 _renew(name)))  # fmt: skip
        elif address is not None and address not in facts.names:
            results.append(Check(check, "fail", f"{cert} names {', '.join(sorted(facts.names))},"
                                 f" not {name}'s address {address}", _renew(name)))  # fmt: skip
        elif left.days < CERT_WARN_DAYS:
            results.append(Check(check, "warn", f"{cert} expires {facts.not_after:%Y-%m-%d} "
                                 f"({left.days} days)", _renew(name)))  # fmt: skip
        else:
            results.append(Check(check, "ok", f"{facts.subject}, until "
                                 f"{facts.not_after:%Y-%m-%d}"))  # fmt: skip
    return results


def _renew(name: str) -> str:
    if name == "ca":
        return "a new CA means new certificates for every host (shingle cluster plan)"
    return (f"on the plan's host: remove {name}.crt and {name}.key from the TLS folder and run "
            f"`shingle cluster add-host` for it again, then render")  # fmt: skip


def check_etcd(plan: clusterplan.Plan, skews: dict[str, float] | None = None) -> list[Check]:
    """Every member's /health (a quorum healthy or fail), and etcd's own member list against
    the plan's (a member added but never started counts against the quorum)."""
    try:
        opener = _opener(plan)
    except OSError as exc:
        return [Check("cluster etcd", "fail", f"the plan's client certificate: {exc}",
                      "copy the plan's TLS folder to this host")]  # fmt: skip
    healthy: list[str] = []
    down: list[str] = []
    listed = None
    for name, endpoint in zip(plan.etcd, plan.etcd_endpoints, strict=True):
        try:
            ok = _get_json(f"{endpoint}/health", opener, skews=skews).get("health") == "true"
            if ok and listed is None:
                listed = _get_json(f"{endpoint}/v3/cluster/member/list", opener, body={})
        except (OSError, ValueError) as exc:
            ok = False
            if isinstance(getattr(exc, "reason", exc), ssl.SSLError):
                down.append(f"{name}: {getattr(exc, 'reason', exc)}")
                continue
        (healthy if ok else down).append(name)
    detail = f"{len(healthy)} of {len(plan.etcd)} members healthy"
    if down:
        detail += f" ({'; '.join(down)} not)"
    results = []
    if len(healthy) <= len(plan.etcd) // 2:
        results.append(
            Check("cluster etcd", "fail", detail + ": no quorum", "systemctl start etcd there")
        )
    else:
        results.append(Check("cluster etcd", "warn" if down else "ok", detail))
    if listed is not None:
        results.append(_members_check(plan, listed.get("members", [])))
    return results


def _members_check(plan: clusterplan.Plan, members: list[dict]) -> Check:
    peers = {
        name: f"{plan.scheme}://{address}:{clusterplan.ETCD_PEER_PORT}"
        for name, address in plan.etcd.items()
    }
    unstarted = [m for m in members if not m.get("name")]
    names = {m["name"] for m in members if m.get("name")}
    missing = [n for n in plan.etcd if n not in names and
               not any(peers[n] in m.get("peerURLs", []) for m in unstarted)]  # fmt: skip
    strangers = sorted(names - set(plan.etcd))
    quorum = len(members) // 2 + 1
    if unstarted:
        urls = ", ".join(u for m in unstarted for u in m.get("peerURLs", []))
        return Check("cluster etcd members", "warn", f"added but not started: {urls} (etcd counts "
                     f"it: {len(members)} members, a quorum of {quorum})",
                     "start etcd there now (shingle cluster render NAME first)")  # fmt: skip
    if missing or strangers:
        said = [f"{', '.join(missing)} in the plan, not in etcd"] if missing else []
        said += [f"{', '.join(strangers)} in etcd, not in the plan"] if strangers else []
        return Check("cluster etcd members", "warn", "; ".join(said),
                     "shingle cluster add-host / remove-host, or the plan of the host that "
                     "made them")  # fmt: skip
    if len(members) % 2 == 0:
        return Check("cluster etcd members", "warn", f"{len(members)} members: a quorum of "
                     f"{quorum}, so they survive as many losses as {len(members) - 1} would",
                     "add or remove one")  # fmt: skip
    return Check("cluster etcd members", "ok", f"{len(members)} members as the plan says")


def patroni_members(
    plan: clusterplan.Plan, skews: dict[str, float] | None = None
) -> list[dict] | None:
    """Patroni's /cluster from the first member that answers (each one's Date when ``skews``
    is given); None when none does."""
    members = None
    for address in plan.postgres.values():
        url = f"http://{address}:{clusterplan.PATRONI_PORT}/cluster"
        try:
            answer = _get_json(url, skews=skews)
        except (OSError, ValueError):
            continue
        if members is None and isinstance(answer, dict) and "members" in answer:
            members = answer["members"]
        if skews is None:
            break
    return members


def check_patroni(plan: clusterplan.Plan, skews: dict[str, float] | None = None) -> list[Check]:
    members = patroni_members(plan, skews)
    if members is None:
        return [Check(
            "cluster patroni", "fail", "no Patroni member answers", "systemctl start patroni"
        )]  # fmt: skip
    running = {m["role"]: m["name"] for m in members if m.get("state") in ("running", "streaming")}
    detail = ", ".join(f"{m['name']} {m['role']} {m.get('state')}" for m in members)
    if "leader" not in running:
        return [Check("cluster patroni", "fail", f"no primary: {detail}")]
    results = []
    if "sync_standby" not in running or len(members) < len(plan.postgres):
        results.append(Check("cluster patroni", "warn", detail, "every member of the plan running"))
    else:
        results.append(Check("cluster patroni", "ok", detail))
    results.append(_lag_check(members))
    return results


def _lag_check(members: list[dict]) -> Check:
    """Replicas' lag behind the primary: past the failover limit a replica cannot be promoted
    (maximum_lag_on_failover, 1 MiB in the plan); 'unknown' means it does not replicate."""
    limit = 1 << 20
    replicas = [m for m in members if m.get("role") != "leader"]
    if not replicas:
        return Check("cluster replication", "warn", "no replica: losing the primary loses the "
                     "catalog", "a second and third PostgreSQL member")  # fmt: skip
    behind = []
    for m in replicas:
        lag = m.get("lag")
        if not isinstance(lag, int) or lag > limit:
            shown = f"{lag / (1 << 20):.1f} MiB" if isinstance(lag, int) else str(lag)
            behind.append(f"{m['name']} {shown}")
    if behind:
        return Check("cluster replication", "warn", f"behind the primary: {', '.join(behind)} "
                     f"(past {limit >> 20} MiB a replica is not promoted)",
                     "look at that member's PostgreSQL log (disk, network)")  # fmt: skip
    worst = max(m["lag"] for m in replicas)
    return Check("cluster replication", "ok", f"{len(replicas)} replicas, lag at most {worst} "
                 "bytes")  # fmt: skip


def check_clocks(skews: dict[str, float], names: dict[str, str]) -> Check:
    """The members' clocks against this host's (from their answers' Date headers)."""
    if not skews:
        return Check("cluster clocks", "warn", "no member answered: clocks not compared")
    host, worst = max(skews.items(), key=lambda item: abs(item[1]))
    detail = (f"{len(skews)} hosts; the farthest, {names.get(host, host)}, "
              f"{worst:+.1f} s from this host")  # fmt: skip
    fix = "run an NTP client (chrony, systemd-timesyncd) on every host"
    if abs(worst) > SKEW_FAIL_S:
        return Check("cluster clocks", "fail", detail + ": Kerberos refuses tickets, new "
                     "certificates are not yet valid there", fix)  # fmt: skip
    if abs(worst) > SKEW_WARN_S:
        return Check("cluster clocks", "warn", detail + ": logs and events out of order, a new "
                     "certificate refused until the clock reaches it", fix)  # fmt: skip
    return Check("cluster clocks", "ok", detail)


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
        try:
            results += check_rendered(plan, member, etc)
        except clusterplan.PlanError as exc:  # the TLS folder not copied here
            results.append(Check("cluster rendered", "fail", str(exc)))
    results += check_certificates(plan, member)
    skews: dict[str, float] = {}
    results += check_etcd(plan, skews) + check_patroni(plan, skews)
    names = {address: name for name, address in {**plan.etcd, **plan.postgres}.items()}
    results.append(check_clocks(skews, names))
    if catalog_url is not None and (url_check := check_catalog_url(plan, catalog_url)):
        results.append(url_check)
    return results
