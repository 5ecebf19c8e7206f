"""The JSON REST API under /api/v1: everything the pages do, for scripts.

Each endpoint is declared once with ``endpoint(...)``: its schema validates the
request and the same declaration becomes its entry in /api/v1/openapi.json.
Authentication: the session cookie (state-changing calls then need the
X-CSRF-Token header) or ``Authorization: Bearer <API token>``. Every endpoint
names the token scope it needs (``scope=``: GETs read-only unless said, other
methods admin unless said; operator for jobs, retention runs and drive actions);
a signed-in admin has every scope. Errors are JSON {"error": message} (with
"fields" for validation errors)."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from flask import Blueprint, g, jsonify, request

from engine.admin import accounts, events, jobs
from engine.admin.schema import Field, Schema, ValidationError
from webui import (
    alerts,
    cluster,
    core,
    crud,
    dashboard,
    datasets,
    drives,
    exports,
    quotas,
    responses,
    retention,
    settings,
    smb,
    tiers,
    trash,
)
from webui import jobs as jobs_pages

bp = Blueprint("api", __name__, url_prefix="/api/v1")
API_VERSION = "1.0.0"


@dataclass(frozen=True)
class Endpoint:
    rule: str
    method: str
    summary: str
    tag: str
    body: Schema | None
    partial: bool
    query: Schema | None
    status: int
    auth: bool
    scope: str  # the least API token scope (engine.admin.accounts.SCOPES) that may call it


ENDPOINTS: list[Endpoint] = []


def endpoint(
    rule: str,
    method: str,
    summary: str,
    tag: str,
    *,
    body: Schema | None = None,
    partial: bool = False,
    query: Schema | None = None,
    status: int = 200,
    auth: bool = True,
    scope: str | None = None,
):
    """Register an API view; it receives ``body=`` / ``query=`` already validated."""
    needed = scope or ("read-only" if method == "GET" else "admin")
    assert needed in accounts.SCOPES, needed

    def deco(fn):
        spec = Endpoint(rule, method, summary, tag, body, partial, query, status, auth, needed)
        ENDPOINTS.append(spec)

        @functools.wraps(fn)
        def view(**kwargs):
            if auth and not g.get("admin"):
                return core.api_error(
                    "authentication required: sign in or send Authorization: Bearer <API token>",
                    401,
                )
            if auth and not accounts.scope_allows(g.get("scope"), needed):
                return core.api_error(
                    f"this API token's scope is {g.get('scope')}: {method} "
                    f"{rule} needs a token of scope {needed} or wider",
                    403,
                )
            try:
                if body is not None:
                    data = request.get_json(silent=True)
                    if data is None:
                        raise ValidationError(
                            {
                                "": "request body: expected a JSON object "
                                "(Content-Type: application/json)"
                            }
                        )
                    kwargs["body"] = body.validate(data, partial=partial)
                if query is not None:
                    kwargs["query"] = query.from_form(request.args)
                result = fn(**kwargs)
            except core.USER_ERRORS as exc:
                return core.api_failure(exc)
            response = jsonify(result)
            response.status_code = status
            return response

        bp.add_url_rule(
            rule, endpoint=f"{fn.__name__}_{method.lower()}", view_func=view, methods=[method]
        )
        return fn

    return deco


# -- status and drives ---------------------------------------------------------------
@endpoint(
    "/status",
    "GET",
    "Capacity per tier, drive states, NFS throughput of the last hour",
    "dashboard",
)
def status():
    return dashboard.summary()


@endpoint("/drives", "GET", "Every drive with state, capacity, SMART and I/O counters", "drives")
def list_drives():
    return drives.drive_rows()


@endpoint(
    "/drives/<int:drive_id>",
    "GET",
    "One drive, with its zones counted by state and band class",
    "drives",
)
def get_drive(drive_id: int):
    row = drives.drive_row(drive_id)
    row["bands"] = drives.band_counts(drive_id)
    return row


@endpoint(
    "/drives/<int:drive_id>/actions",
    "POST",
    "Mark failed, drain, request a rebuild or start a SMART short self-test",
    "drives",
    body=drives.ACTION_SCHEMA,
    scope="operator",
)
def drive_action(drive_id: int, body: dict):
    message, job_id = drives.do_action(drive_id, body["action"], core.actor())
    return {"message": message, "job": job_id}


# -- drive lifecycle: add and replace (jobs the daemon runs) ---------------------------------
@endpoint(
    "/drives",
    "POST",
    "Add a drive (a new folder becomes an emulated drive, or a zoned "
    "block device) and rebuild onto it; a job the daemon runs",
    "drives",
    body=drives.NEW_DRIVE_SCHEMA,
    status=202,
    scope="admin",
)
def add_drive(body: dict):
    return jobs.get(core.ctx().catalog, drives.queue_new_drive(body, core.actor())).to_dict()


@endpoint(
    "/drives/<int:drive_id>/replace",
    "POST",
    "Replace a drive by a new one: the old one is "
    "drained (or rebuilt from redundancy) and removed; a job the daemon runs",
    "drives",
    body=drives.NEW_DRIVE_SCHEMA,
    status=202,
    scope="admin",
)
def replace_drive(drive_id: int, body: dict):
    job_id = drives.queue_new_drive(body, core.actor(), replaces=drive_id)
    return jobs.get(core.ctx().catalog, job_id).to_dict()


# -- the cluster's hosts (jobs the daemon runs; `shingle cluster`) -----------------------------
@endpoint(
    "/hosts",
    "GET",
    "The cluster's hosts: state, drives, fragments, how many may be lost, and the drain or "
    "rebuild under way on each (progress, rate)",
    "hosts",
)
def list_hosts():
    return cluster.report()


@endpoint("/hosts/<host>", "GET", "One host, as in the list", "hosts")
def get_host(host: str):
    return cluster.host(host)


@endpoint(
    "/hosts",
    "POST",
    "Join a storage host: record its agent's drives and start using them, then rebuild what "
    "lacks fragments; a job the daemon runs",
    "hosts",
    body=cluster.JOIN_SCHEMA,
    status=202,
)
def join_host(body: dict):
    return jobs.get(core.ctx().catalog, cluster.join(body)).to_dict()


@endpoint(
    "/hosts/<host>/drain",
    "POST",
    "Move every fragment of a host onto the others (paced), then retire its drives; refused "
    "when the others could not hold the widest stripe; a job the daemon runs",
    "hosts",
    body=cluster.PACE_SCHEMA,
    status=202,
)
def drain_host(host: str, body: dict):
    return jobs.get(core.ctx().catalog, cluster.drain(host, body)).to_dict()


@endpoint(
    "/hosts/<host>/remove",
    "POST",
    "Take a host out of the pool: a drained or empty one at once, one whose agent does not "
    "answer declared gone and rebuilt from the others; a job the daemon runs",
    "hosts",
    body=cluster.PACE_SCHEMA,
    status=202,
)
def remove_host(host: str, body: dict):
    return jobs.get(core.ctx().catalog, cluster.remove(host, body)).to_dict()


@endpoint(
    "/hosts/<host>/replace",
    "POST",
    "Join a new host, then drain this one (or rebuild it from the others if it does not "
    "answer); a job the daemon runs",
    "hosts",
    body=cluster.REPLACE_SCHEMA,
    status=202,
)
def replace_host(host: str, body: dict):
    return jobs.get(core.ctx().catalog, cluster.replace(host, body)).to_dict()


# -- retention -------------------------------------------------------------------------------
crud.register(retention.API, endpoint)


@endpoint(
    "/retention/preview",
    "GET",
    "What a run would do now (nothing changes)",
    "retention",
    query=retention.RUN_SCHEMA,
)
def preview(query: dict):
    return [item.to_dict() for item in retention.service().preview(query.get("rule_id"))]


@endpoint(
    "/retention/run",
    "POST",
    "Queue a retention job for the daemon (one rule, or every enabled rule); "
    "follow it with GET /api/v1/jobs/{job_id}",
    "retention",
    body=retention.RUN_SCHEMA,
    status=202,
    scope="operator",
)
def run(body: dict):
    return jobs.get(
        core.ctx().catalog, retention.queue_run(body.get("rule_id"), core.actor())
    ).to_dict()


# -- trash --------------------------------------------------------------------------------------
TRASH_PURGE_SCHEMA = Schema(
    "TrashPurge",
    "What to purge: one entry, or the entries deleted at least older_than_s ago (0: all); "
    "with neither, those past their export's trash days.",
    (
        Field("entry", "integer", "A trash entry's id", required=False, minimum=1),
        Field(
            "older_than_s",
            "number",
            "Seconds since deletion (0 empties the trash)",
            required=False,
            minimum=0,
        ),
    ),
)


@endpoint("/trash", "GET", "Every trash entry, with the bytes purging it frees", "trash")
def list_trash():
    return trash.entries()


@endpoint(
    "/trash/<int:entry_id>/restore",
    "POST",
    "Put a trash entry back where it was deleted from",
    "trash",
    scope="operator",
)
def restore_trash(entry_id: int):
    return {"restored": entry_id, "path": trash.restore(entry_id, core.actor())}


@endpoint(
    "/trash/purge",
    "POST",
    "Queue a trash-purge job for the daemon; follow it with GET /api/v1/jobs/{job_id}",
    "trash",
    body=TRASH_PURGE_SCHEMA,
    status=202,
    scope="operator",
)
def purge_trash(body: dict):
    job_id = trash.queue_purge(
        core.actor(), entry=body.get("entry"), older_than_s=body.get("older_than_s")
    )
    return jobs.get(core.ctx().catalog, job_id).to_dict()


# -- datasets: snapshots and their schedules ---------------------------------------------------
@endpoint("/datasets", "GET", "Datasets: directories with snapshots or a schedule", "datasets")
def list_datasets():
    return [
        d.to_dict()
        for d in datasets.dataset_service.datasets(
            core.ctx().namespace, datasets.scheduler(), datasets.snapshots()
        )
    ]


@endpoint(
    "/snapshots",
    "GET",
    "Snapshots with their space (one dataset, or every one)",
    "datasets",
    query=datasets.LIST_SCHEMA,
)
def list_snapshots(query: dict):
    return datasets.list_snapshots(query.get("path"), bool(query.get("recount")))


@endpoint(
    "/snapshots/preview",
    "GET",
    "What creating, deleting or rolling back a snapshot would do (nothing changes)",
    "datasets",
    query=datasets.PREVIEW_SCHEMA,
)
def preview_snapshot(query: dict):
    return datasets.preview(query["action"], query["path"], query["name"]).to_dict()


@endpoint(
    "/snapshots",
    "POST",
    "Take a snapshot of a dataset (no data is copied; its time grows with the number of files)",
    "datasets",
    body=datasets.SNAPSHOT_SCHEMA,
    status=201,
    scope="operator",
)
def create_snapshot(body: dict):
    return datasets.create_snapshot(body["path"], body["name"])


@endpoint(
    "/snapshots/clone",
    "POST",
    "A writable clone of a snapshot at a new path, sharing every stripe (constant time)",
    "datasets",
    body=datasets.CLONE_SCHEMA,
    status=201,
    scope="operator",
)
def clone_snapshot(body: dict):
    return datasets.clone_snapshot(body["path"], body["name"], body["new_path"])


@endpoint(
    "/snapshots/delete",
    "POST",
    "Delete a snapshot (frees its unique bytes); preview it first",
    "datasets",
    body=datasets.SNAPSHOT_SCHEMA,
)
def delete_snapshot(body: dict):
    return datasets.delete_snapshot(body["path"], body["name"])


@endpoint(
    "/snapshots/rollback",
    "POST",
    "Make the dataset what the snapshot holds; preview it first",
    "datasets",
    body=datasets.SNAPSHOT_SCHEMA,
)
def rollback_snapshot(body: dict):
    return datasets.rollback_snapshot(body["path"], body["name"])


@endpoint(
    "/snapshots/archive",
    "POST",
    "Queue a job that moves the stripes only this snapshot references to the cold tier",
    "datasets",
    body=datasets.SNAPSHOT_SCHEMA,
    status=202,
    scope="operator",
)
def archive_snapshot(body: dict):
    job_id = datasets.queue_archive(body["path"], body["name"], core.actor())
    return jobs.get(core.ctx().catalog, job_id).to_dict()


crud.register(datasets.SCHEDULE_API, endpoint)


@endpoint(
    "/snapshot-schedules/preview",
    "GET",
    "What a schedule run would do now: due snapshots and deletions (nothing changes)",
    "datasets",
    query=datasets.RUN_SCHEMA,
)
def preview_schedules(query: dict):
    return [p.to_dict() for p in datasets.scheduler().preview(query.get("schedule_id"))]


@endpoint(
    "/snapshot-schedules/run",
    "POST",
    "Queue a snapshot-schedule job for the daemon (one schedule, or every enabled one); "
    "follow it with GET /api/v1/jobs/{job_id}",
    "datasets",
    body=datasets.RUN_SCHEMA,
    status=202,
    scope="operator",
)
def run_schedules(body: dict):
    job_id = datasets.queue_run(body.get("schedule_id"), core.actor())
    return jobs.get(core.ctx().catalog, job_id).to_dict()


# -- jobs ---------------------------------------------------------------------------------------
@endpoint("/jobs", "GET", "Recent jobs, newest first, with progress", "jobs")
def list_jobs():
    return [job.to_dict() for job in jobs.recent(core.ctx().catalog, 50)]


@endpoint(
    "/jobs/<int:job_id>", "GET", "One job: state, progress and, once finished, its result", "jobs"
)
def get_job(job_id: int):
    return jobs.get(core.ctx().catalog, job_id).to_dict()


@endpoint(
    "/jobs",
    "POST",
    "Queue a maintenance job for the daemon",
    "jobs",
    body=jobs_pages.QUEUE_SCHEMA,
    status=202,
    scope="operator",
)
def queue_job(body: dict):
    return jobs.get(core.ctx().catalog, jobs_pages.queue(body["kind"], {}, core.actor())).to_dict()


# -- exports -------------------------------------------------------------------------------------
crud.register(exports.API, endpoint)


# -- quotas --------------------------------------------------------------------------------------
crud.register(quotas.API, endpoint)


@endpoint(
    "/quotas/recount",
    "POST",
    "Count every quota's tree again and correct the counters",
    "quotas",
    scope="operator",
)
def recount_quotas():
    return quotas.recount(core.actor())


# -- NFS clients --------------------------------------------------------------------------------
@endpoint(
    "/nfs/clients",
    "GET",
    "NFSv4 clients the catalog records, with their principals and the delegations they hold",
    "exports",
)
def nfs_clients():
    return exports.nfs_clients()


# -- SMB -----------------------------------------------------------------------------------------
@endpoint(
    "/smb/status",
    "GET",
    "smbd's health and connected sessions (smbstatus), shares and users counted",
    "smb",
)
def smb_status():
    return smb.status()


crud.register(smb.SHARE_API, endpoint)


@endpoint("/smb/users", "GET", "SMB users and the uid/gid their files get", "smb")
def list_smb_users():
    return smb.list_users()


@endpoint(
    "/smb/users",
    "POST",
    "Create an SMB user; the password goes to Samba's passdb only",
    "smb",
    body=smb.USER_SCHEMA,
    status=201,
)
def create_smb_user(body: dict):
    return smb.create_user(body, core.actor())


@endpoint("/smb/users/<name>", "GET", "One SMB user", "smb")
def get_smb_user(name: str):
    return smb.get_user(name)


@endpoint(
    "/smb/users/<name>/password",
    "PUT",
    "Set an SMB user's password",
    "smb",
    body=smb.PASSWORD_SCHEMA,
)
def set_smb_password(name: str, body: dict):
    smb.set_password(name, body["password"], core.actor())
    return {"name": name, "message": f"SMB user {name}: password changed"}


@endpoint("/smb/users/<name>", "DELETE", "Remove an SMB user (their files keep their owner)", "smb")
def delete_smb_user(name: str):
    smb.delete_user(name, core.actor())
    return {"deleted": name}


# -- tiers -----------------------------------------------------------------------------------------
@endpoint("/tiers", "GET", "Band classes, tiering thresholds and pinned paths", "tiers")
def get_tiers():
    return tiers.overview()


@endpoint(
    "/tiers/thresholds",
    "PATCH",
    "Change tiering thresholds",
    "tiers",
    body=tiers.THRESHOLDS,
    partial=True,
)
def set_thresholds(body: dict):
    return tiers.set_thresholds(body, core.actor())


@endpoint(
    "/tiers/pins",
    "POST",
    "Pin a path (and everything below it) to a band class, or unpin it",
    "tiers",
    body=tiers.PIN,
)
def pin(body: dict):
    return {
        "path": body["path"],
        "band_class": body["band_class"],
        "inodes": tiers.pin(body["path"], body["band_class"], core.actor()),
    }


# -- alerts ----------------------------------------------------------------------------------
@endpoint(
    "/alerts", "GET", "Alerts, open ones (active, acknowledged) first, then cleared ones", "alerts"
)
def list_alerts():
    return [a.to_dict() for a in alerts.service().list()]


@endpoint(
    "/alerts/<int:alert_id>/ack",
    "POST",
    "Acknowledge an active alert (it stays open until its condition is gone)",
    "alerts",
    scope="operator",
)
def ack_alert(alert_id: int):
    return alerts.acknowledge(alert_id, core.actor())


# -- events and tokens -----------------------------------------------------------------------------
EVENTS_QUERY = Schema(
    "EventsQuery",
    "Which events to list, newest first.",
    (
        Field(
            "limit",
            "integer",
            "How many events",
            required=False,
            minimum=1,
            maximum=1000,
            default=100,
        ),
        Field(
            "kind",
            "string",
            "Only kinds starting with this, e.g. retention. or drive.",
            required=False,
            max_length=64,
        ),
        Field(
            "before",
            "integer",
            "Only events older than this id (paging)",
            required=False,
            minimum=1,
        ),
    ),
)


@endpoint(
    "/events", "GET", "The audit and activity log, newest first", "events", query=EVENTS_QUERY
)
def list_events(query: dict):
    rows = events.recent(
        core.ctx().catalog,
        query["limit"],
        kind_prefix=query.get("kind") or None,
        before_id=query.get("before"),
    )
    return [
        {
            "id": e.id,
            "time_ns": e.time_ns,
            "kind": e.kind,
            "severity": e.severity,
            "actor": e.actor,
            "message": e.message,
            "details": e.details,
        }
        for e in rows
    ]


@endpoint(
    "/tokens",
    "GET",
    "API tokens (names, scopes, expiry and use, never the secrets)",
    "settings",
    scope="admin",
)
def list_tokens():
    return settings.list_tokens()


@endpoint(
    "/tokens",
    "POST",
    "Create an API token; the response is the one chance to read it",
    "settings",
    body=settings.TOKEN_SCHEMA,
    status=201,
)
def create_token(body: dict):
    token = settings.make_token(body, core.actor())
    return {
        "name": body["name"],
        "token": token,
        "scope": body["scope"],
        "expires_days": body["expires_days"] or None,
    }


@endpoint("/tokens/<int:token_id>", "DELETE", "Revoke an API token", "settings")
def revoke_token(token_id: int):
    settings.revoke_token(token_id, core.actor())
    return {"deleted": token_id}


# -- the OpenAPI document --------------------------------------------------------------------------
ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {"type": "string", "description": "What failed, the value, and what was expected"},
        "fields": {
            "type": "object",
            "description": "Validation errors by field name",
            "additionalProperties": {"type": "string"},
        },
    },
}


ERROR_RESPONSES = {
    "400": "invalid input",
    "401": "not signed in and no valid API token",
    "403": "the API token's scope is too narrow",
    "404": "no such object",
}


def _json(schema: dict) -> dict:
    return {"application/json": {"schema": schema}}


def _parameters(spec) -> list[dict]:
    """The route's path parameters, then its query's fields."""
    params = [
        {
            "name": name,
            "in": "path",
            "required": True,
            "description": f"{name.replace('_', ' ')}",
            "schema": {"type": "integer", "minimum": 1} if kind else {"type": "string"},
        }
        for kind, name in re.findall(r"<(int:)?(\w+)>", spec.rule)
    ]
    if spec.query is not None:
        for f in spec.query.fields:
            params.append(
                {
                    "name": f.name,
                    "in": "query",
                    "required": f.required and f.default is None,
                    "description": f.description,
                    "schema": f.openapi(),
                }
            )
    return params


def _operation(spec, path: str) -> dict:
    described, body_schema = responses.for_route(spec.method, spec.rule)
    error = _json({"$ref": "#/components/schemas/Error"})
    op: dict = {
        "summary": spec.summary,
        "tags": [spec.tag],
        "operationId": f"{spec.method.lower()}_" + re.sub(r"\W+", "_", path).strip("_"),
        "responses": {
            str(spec.status): {"description": described, "content": _json(body_schema)},
            **{
                status: {"description": text, "content": error}
                for status, text in ERROR_RESPONSES.items()
            },
        },
    }
    op["x-required-scope"] = spec.scope
    params = _parameters(spec)
    if params:
        op["parameters"] = params
    if spec.body is not None:
        op["requestBody"] = {
            "required": True,
            "content": _json(spec.body.openapi(partial=spec.partial)),
        }
    return op


def openapi_document() -> dict:
    paths: dict = {}
    for spec in ENDPOINTS:
        path = re.sub(r"<(?:int:)?(\w+)>", r"{\1}", spec.rule)
        paths.setdefault("/api/v1" + path, {})[spec.method.lower()] = _operation(spec, path)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "shingle admin API",
            "version": API_VERSION,
            "description": "Everything the admin web UI does. Authenticate with a session cookie "
            "plus the X-CSRF-Token header, or with Authorization: Bearer <API token> (create one "
            "on the settings page or with POST /api/v1/tokens).",
        },
        "security": [{"bearerAuth": []}, {"cookieAuth": []}],
        "components": {
            "securitySchemes": {
                "bearerAuth": {"type": "http", "scheme": "bearer"},
                "cookieAuth": {"type": "apiKey", "in": "cookie", "name": "shingle_session"},
            },
            "schemas": {"Error": ERROR, **responses.SCHEMAS},
        },
        "paths": paths,
    }


@bp.route("/openapi.json")
def openapi():
    return jsonify(openapi_document())


@endpoint(
    "/csrf",
    "GET",
    "The session's CSRF token, for scripts that sign in with the login form and then "
    "send it as the X-CSRF-Token header",
    "settings",
)
def csrf():
    return {"csrf_token": core.csrf_token(), "header": core.CSRF_HEADER}
