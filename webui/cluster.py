"""The cluster's hosts in the REST API (webui/api.py, /api/v1/hosts): what `shingle cluster`
does. The web UI never talks to an agent or a drive: joining, draining, removing and replacing
are jobs the daemon (in a cluster, its maintenance leader) runs; the checks that can refuse
(an unknown host, one that does not answer, too few hosts left for the widest band class) run
here first and change nothing when they refuse."""

from __future__ import annotations

from engine.admin.schema import Field, Schema
from engine.lifecycle import hostops
from webui import core
from webui.hosts import cluster
from webui.jobs import queue

ADDRESS_PATTERN = r"[A-Za-z0-9_.:\[\]-]+:[0-9]{1,5}"
RATE = Field(
    "rate_mib_s",
    "number",
    "This job's write pace in MiB/s (default: maintenance.rebuild_mib_s)",
    required=False,
    minimum=0.01,
    maximum=100000,
)
ADDRESS = Field(
    "address",
    "string",
    "The drive agent's HOST:PORT, as the daemon reaches it",
    min_length=3,
    max_length=300,
    pattern=ADDRESS_PATTERN,
    example="10.0.0.21:7400",
)
JOIN_SCHEMA = Schema("HostJoin", "A storage host to join, by its drive agent.", (ADDRESS, RATE))
REPLACE_SCHEMA = Schema(
    "HostReplace",
    "The agent of the host that replaces this one (joined, then this one drained or, if it "
    "does not answer, rebuilt from the others).",
    (ADDRESS, RATE),
)
PACE_SCHEMA = Schema("HostPace", "Options of a drain or a removal.", (RATE,))


def report() -> dict:
    return cluster().to_dict()


def host(name: str) -> dict:
    view = cluster()
    found = view.host(name)  # NotFound naming the known hosts
    return {**found.to_dict(), "operation": view.operation(found)}


def _params(body: dict, **params) -> dict:
    if body.get("rate_mib_s"):
        params["rate_mib_s"] = body["rate_mib_s"]
    return params


def join(body: dict) -> int:
    return queue("host-join", _params(body, address=body["address"]), core.actor())


def drain(name: str, body: dict) -> int:
    shingle = core.ctx()
    hostops.start_drain_host(shingle.catalog, name, shingle.policies, actor=core.actor())
    return queue("host-drain", _params(body, host=name), core.actor())


def remove(name: str, body: dict) -> int:
    shingle = core.ctx()
    hostops.start_remove_host(shingle.catalog, name, shingle.policies, actor=core.actor())
    return queue("host-remove", _params(body, host=name), core.actor())


def replace(name: str, body: dict) -> int:
    shingle = core.ctx()
    shingle.catalog.read(lambda conn: hostops.resolve_host_in(conn, name))
    params = _params(body, host=name, address=body["address"])
    return queue("host-replace", params, core.actor())
