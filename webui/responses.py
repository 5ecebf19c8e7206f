"""Response bodies of the REST API, as OpenAPI schemas (components/schemas of /api/v1/openapi.json).

Declared once here, with ``ROUTES`` naming each API route's (webui/api.py) response; an admin
object's schema comes from its engine schema (the fields it takes, plus its id and what the
engine adds), and webui/crud.py adds the routes of its five CRUD endpoints to ``ROUTES``. A test
checks real responses against them (tests/webui/test_api_responses.py), so they cannot drift."""

from __future__ import annotations

from engine.admin import exports as export_service
from engine.admin import smb as smb_service
from engine.snapshots.retention import RULE_SCHEMA


def prop(kind: str | list, description: str, **extra) -> dict:
    return {"type": kind, "description": description, **extra}


def obj(description: str, required: tuple[str, ...] = (), **properties: dict) -> dict:
    out = {"type": "object", "description": description, "properties": properties}
    if required:
        out["required"] = list(required)
    return out


def ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def array_of(name: str, description: str) -> dict:
    return {"type": "array", "description": description, "items": ref(name)}


NS = "nanoseconds since the Unix epoch"
SCHEMAS: dict[str, dict] = {
    "Capacity": obj(
        "Capacity of the usable drives (online, degraded, draining), in bytes",
        ("raw_bytes", "usable_bytes", "free_bytes"),
        raw_bytes=prop("integer", "Zones times zone size"),
        usable_bytes=prop(
            "integer", "User data that fits when full (after parity and the cleaning reserve)"
        ),
        free_bytes=prop("integer", "User data that still fits"),
        written_bytes=prop("integer", "Bytes below the zones' write pointers"),
        live_bytes=prop("integer", "Bytes of live fragments"),
        garbage_bytes=prop("integer", "Dead bytes band cleaning can reclaim"),
        reserve_bytes=prop("integer", "Empty space kept for band cleaning"),
        stranded_bytes=prop("integer", "Tails of full zones, writable again after a reset"),
        data_fraction=prop("number", "Share of raw bytes that carry data (k / (k + m) of warm)"),
    ),
    "Status": obj(
        "The dashboard's summary",
        ("capacity", "drives"),
        capacity=ref("Capacity"),
        space=prop(
            "object",
            "Raw bytes of the usable drives by state (live, garbage, reserve, free, stranded), "
            "adding up to capacity.raw_bytes",
        ),
        catalog=obj(
            "The catalog",
            backend=prop("string", "sqlite or postgresql"),
            url=prop("string", "Catalog URL, password hidden"),
            revision=prop("string", "Schema revision"),
            inodes=prop("integer", "Files and folders"),
        ),
        tiers=prop("object", "Per band class: zones and live bytes"),
        drive_states=prop("object", "Drive count by state"),
        drives=prop("integer", "How many drives"),
        throughput=prop(
            "object", "NFS bytes/s over the window: read and write lists of [time_ns, rate]"
        ),
        window=prop("array", "The window's [start, end] in " + NS),
        redundancy=ref("Redundancy"),
        leader=obj(
            "The cluster's maintenance leader (null on a single host: no [cluster] etcd_endpoints)",
            holder=prop(["string", "null"], "The host that took office last (the catalog's fence)"),
            token=prop(["integer", "null"], "Its fencing token (the leader key's etcd revision)"),
            since_ns=prop(["integer", "null"], "When it took office, in " + NS),
            etcd_holder=prop(["string", "null"], "Who holds the leader key in etcd now"),
            etcd_error=prop(["string", "null"], "Why etcd did not say (unreachable)"),
        )
        | {"type": ["object", "null"]},
        hosts=ref("Hosts"),
    ),
    "Hosts": obj(
        "The storage hosts (failure domains) and how many may be lost without losing data",
        ("count", "losable_by_placement", "hosts"),
        count=prop("integer", "Hosts with drives in the pool"),
        losable=prop(
            ["integer", "null"],
            "Hosts any of which may be lost with every stored stripe still readable "
            "(null: no stripe stored)",
        ),
        losable_by_placement=prop(
            "integer", "The same for a stripe of the default class written now"
        ),
        hosts=prop(
            "array",
            "Per host: name (local: the head's own), drives, drives_readable, fragments",
            items=obj(
                "One host",
                ("name", "drives"),
                name=prop("string", "Host name (local: the head's own)"),
                drives=prop("integer", "Drives on it"),
                drives_readable=prop("integer", "Drives read from (online, degraded, draining)"),
                fragments=prop("integer", "Readable fragments of live stripes on it"),
            ),
        ),
    ),
    "HostOperation": obj(
        "The moving job that works on a host (a host job naming it, a drain of one of its drives)",
        ("job", "kind", "state"),
        job=prop("integer", "Job id"),
        kind=prop("string", "host-drain, host-remove, host-replace, host-join or drain"),
        state=prop("string", "queued or running"),
        done_bytes=prop("integer", "Bytes moved or rebuilt so far"),
        total_bytes=prop("integer", "Bytes the job found to do"),
        mb_per_s=prop("number", "Its rate since it started, MB/s"),
        message=prop(["string", "null"], "Its latest progress message"),
    ),
    "HostDrive": obj(
        "One drive of a host",
        ("id", "state"),
        id=prop("integer", "Drive id"),
        uuid=prop("string", "Drive uuid"),
        path=prop("string", "Its folder or device (an agent's drive: the agent's HOST:PORT)"),
        backend=prop("string", "zonefile, zoned-block or agent"),
        state=prop("string", "online, degraded, draining, missing or failed"),
        capacity_bytes=prop("integer", "Zones times zone size"),
        written_bytes=prop("integer", "Bytes below its zones' write pointers"),
        live_bytes=prop("integer", "Bytes of live fragments"),
        garbage_bytes=prop("integer", "Dead bytes band cleaning can reclaim"),
        fragments=prop("integer", "Fragments on it"),
        fragment_bytes=prop("integer", "Their bytes"),
    ),
    "ClusterHost": obj(
        "A storage host (a failure domain): its drive agent's drives, or the head's own "
        "(named local)",
        ("name", "state", "drives"),
        name=prop("string", "The host's name (its agent's --host)"),
        state=prop(
            "string",
            "up, degraded (a drive not online), draining (every drive), lost (no drive "
            "answers: its agent is gone, or it was declared gone and is rebuilt elsewhere)",
        ),
        address=prop(["string", "null"], "Its agent's HOST:PORT (null: the head's own drives)"),
        drives=array_of("HostDrive", "Its drives not removed"),
        drives_readable=prop("integer", "Drives read from (online, degraded, draining)"),
        capacity_bytes=prop("integer", "Its drives' capacity"),
        written_bytes=prop("integer", "Bytes below its zones' write pointers"),
        live_bytes=prop("integer", "Bytes of live fragments"),
        fragments=prop("integer", "Fragments on its drives"),
        fragment_bytes=prop("integer", "Their bytes"),
        waiting_fragments=prop(
            "integer", "Fragments on its failed, missing or draining drives: to rebuild or move"
        ),
        waiting_bytes=prop("integer", "Their bytes"),
        operation={
            "oneOf": [ref("HostOperation"), {"type": "null"}],
            "description": "The drain or rebuild under way on it (null: none)",
        },
    ),
    "ClusterHosts": obj(
        "The cluster's hosts and how many may be lost without losing data",
        ("count", "hosts"),
        count=prop("integer", "Hosts with drives in the pool"),
        k=prop("integer", "Data fragments of the stripes counted (the warm class)"),
        m=prop("integer", "Their parity fragments"),
        losable=prop(
            ["integer", "null"], "Hosts the stored stripes may lose (null: nothing stored)"
        ),
        losable_by_placement=prop("integer", "Hosts a stripe placed now may lose"),
        may_lose=prop("integer", "losable, or before anything is stored losable_by_placement"),
        hosts=array_of("ClusterHost", "Each host"),
        moving=array_of("Job", "Jobs moving fragments between hosts, queued or running"),
    ),
    "Redundancy": obj(
        "Redundancy of the live stripes on drives",
        ("stripes", "under_protected"),
        stripes=prop("integer", "Live stripes on drives (inline stripes live in the catalog)"),
        under_protected=prop("integer", "Stripes missing at least one fragment"),
        no_redundancy=prop("integer", "Stripes one more loss away from losing data"),
        lost=prop("integer", "Stripes with fewer readable fragments than they need"),
        on_draining=prop("integer", "Stripes with a fragment on a draining drive"),
    ),
    "Drive": obj(
        "One drive",
        ("id", "state", "path"),
        id=prop("integer", "Drive id"),
        uuid=prop("string", "Label written on the drive"),
        path=prop("string", "Folder (zone files) or device"),
        backend=prop("string", "zonefile, zoned-block or agent"),
        host=prop(["string", "null"], "Storage host of an agent's drive (null: this host)"),
        device=prop(["string", "null"], "Block device for SMART"),
        model=prop(["string", "null"], "Model"),
        serial=prop(["string", "null"], "Serial number"),
        state=prop("string", "online, degraded, failed, draining, removed or missing"),
        size_bytes=prop("integer", "Capacity"),
        zone_size=prop("integer", "Bytes per zone"),
        zones=prop("integer", "Zone count"),
        zones_empty=prop("integer", "Empty zones"),
        zones_open=prop("integer", "Open zones"),
        zones_full=prop("integer", "Full zones"),
        written_bytes=prop("integer", "Bytes below write pointers"),
        live_bytes=prop("integer", "Live bytes"),
        garbage_bytes=prop("integer", "Dead bytes"),
        fragments=prop("integer", "Fragments stored"),
        smart=prop(["object", "null"], "SMART reading (smartctl), or why there is none"),
        io=prop(
            ["object", "null"],
            "This drive's own I/O counters as the daemon last sampled them (read_bytes, "
            "written_bytes, read_errors, write_errors, checksum_errors, errors: the sum of "
            "those three), null before its first sample. A zoned block device adds "
            "device_errors (errors the device returned: bad sectors, zones gone read-only or "
            "offline; each also counted as a read or write error) and off_pointer_errors (of "
            "those, writes the device refused as not at its write pointer: expected 0, any "
            "means shingle's view of a zone was wrong)",
        ),
        bands=prop("object", "Only GET /drives/{id}: zones by state and band class"),
    ),
    "ActionResult": obj(
        "What an action did",
        ("message",),
        message=prop("string", "What happened"),
        job=prop(["integer", "null"], "The queued job's id, if the action queued one"),
    ),
    "RetentionRule": RULE_SCHEMA.response(
        "A keep-last-N rule",
        "Rule id",
        created_ns=prop("integer", "Created, " + NS),
        last_run_ns=prop(["integer", "null"], "Last run, " + NS),
    ),
    "PlannedAction": obj(
        "One thing a rule would do (preview) or did (run)",
        ("rule_id", "path", "action"),
        rule_id=prop("integer", "Rule id"),
        path=prop("string", "Entry"),
        action=prop("string", "delete, cold, trash, or skip"),
        reason=prop("string", "Why"),
        mtime_ns=prop("integer", "Entry's mtime, " + NS),
        mtime=prop("string", "Entry's mtime, ISO 8601"),
        ino=prop("integer", "Inode"),
        is_dir=prop("boolean", "A folder"),
        outcome=prop(["string", "null"], "After a run: done, skipped: ... or failed: ..."),
    ),
    "Job": obj(
        "A maintenance job and its progress",
        ("id", "kind", "state"),
        id=prop("integer", "Job id"),
        kind=prop("string", "retention, scrub, rebuild, drain, tier, clean, ..."),
        state=prop(
            "string",
            "queued, running, done, warnings (done with warnings: see message), "
            "failed or interrupted",
        ),
        actor=prop("string", "Who queued it"),
        params=prop("object", "Parameters"),
        done=prop("integer", "Work done"),
        total=prop("integer", "Work"),
        fraction=prop("number", "done / total, 0-1"),
        message=prop(["string", "null"], "Progress or outcome"),
        result=prop(["object", "array", "null"], "Once finished: the job's report"),
        created_ns=prop("integer", "Queued, " + NS),
        started_ns=prop(["integer", "null"], "Started, " + NS),
        finished_ns=prop(["integer", "null"], "Finished, " + NS),
        heartbeat_ns=prop(["integer", "null"], "Last sign of life of the daemon running it, " + NS),
        attempts=prop("integer", "Times it was started (a job a dead daemon left is re-queued)"),
    ),
    "Export": export_service.SCHEMA.response("An NFS export", "Export id"),
    "Quota": obj(
        "A quota on a directory tree: bytes are the logical sizes of its regular files, files "
        "its inodes below the root (snapshots not counted); a null limit is none",
        ("id", "path", "bytes_limit", "files_limit", "used_bytes", "used_files"),
        id=prop("integer", "Quota id"),
        path=prop("string", "The directory, as the quota was set (or its path now if renamed)"),
        root_ino=prop("integer", "The directory's inode"),
        bytes_limit=prop(["integer", "null"], "Hard limit in bytes (EDQUOT past it)"),
        files_limit=prop(["integer", "null"], "Hard limit of inodes"),
        soft_bytes=prop(["integer", "null"], "Soft limit in bytes (an alert past it)"),
        soft_files=prop(["integer", "null"], "Soft limit of inodes (an alert past it)"),
        used_bytes=prop("integer", "Bytes used"),
        used_files=prop("integer", "Inodes used"),
    ),
    "QuotaRecount": obj(
        "What a recount corrected",
        ("corrected",),
        corrected=prop("array", "One line per counter that was wrong", items={"type": "string"}),
    ),
    "Tiers": obj(
        "Band classes and tiering settings",
        ("band_classes",),
        band_classes=prop(
            "array",
            "Each class: name, redundancy, fragment size, compression and its level, zones, live "
            "bytes, compression_ratio (user bytes per stored byte), stripes, stripes_compressed",
        ),
        thresholds=ref("Thresholds"),
        path_rules=prop("array", "[path prefix, class] pins"),
        pinned=prop("array", "Pinned paths"),
    ),
    "Thresholds": obj(
        "Tiering thresholds",
        hot_to_warm_after_s=prop("number", "Seconds idle before hot data goes warm"),
        warm_to_cold_after_s=prop("number", "Seconds idle before warm data goes cold"),
        promote_reads=prop("integer", "Reads within the window that bring data back"),
        promote_window_s=prop("number", "The promotion window, seconds"),
    ),
    "Pin": obj(
        "A pinned path",
        ("path", "band_class"),
        path=prop("string", "Path"),
        band_class=prop(["string", "null"], "Class, or null when unpinned"),
        inodes=prop("integer", "Inodes changed"),
    ),
    "Event": obj(
        "An audit or activity event",
        ("id", "time_ns", "kind", "message"),
        id=prop("integer", "Event id"),
        time_ns=prop("integer", "When, " + NS),
        kind=prop("string", "e.g. retention.run, drive.state"),
        severity=prop("string", "info, warning or error"),
        actor=prop("string", "Who"),
        message=prop("string", "What happened"),
        details=prop(["object", "null"], "Details"),
    ),
    "Token": obj(
        "An API token (never its secret)",
        ("id", "name"),
        id=prop("integer", "Token id"),
        name=prop("string", "Name"),
        username=prop("string", "Owner"),
        created_ns=prop("integer", "Created, " + NS),
        last_used_ns=prop(["integer", "null"], "Last used, " + NS),
        scope=prop("string", "read-only, operator or admin"),
        expires_ns=prop(["integer", "null"], "Expires, " + NS + " (null: never)"),
    ),
    "NewToken": obj(
        "A new API token: the only time its secret is shown",
        ("name", "token"),
        name=prop("string", "Name"),
        token=prop("string", "Send as Authorization: Bearer <token>"),
        scope=prop("string", "read-only, operator or admin"),
        expires_days=prop(["integer", "null"], "Days until it stops working (null: never)"),
    ),
    "SmbShare": smb_service.SHARE_SCHEMA.response("An SMB share", "Share id"),
    "SmbUser": obj(
        "An SMB user (the password is only in Samba's passdb)",
        ("id", "name", "uid", "gid"),
        id=prop("integer", "User id"),
        name=prop("string", "User name"),
        uid=prop("integer", "uid its files get"),
        gid=prop("integer", "gid its files get"),
    ),
    "SmbPasswordSet": obj(
        "A password changed",
        ("name", "message"),
        name=prop("string", "The SMB user"),
        message=prop("string", "What happened"),
    ),
    "NfsClient": obj(
        "An NFSv4 client the server recorded, and the delegations it holds",
        ("clientid", "principal", "delegations"),
        clientid=prop("string", "Client id (hex)"),
        address=prop("string", "Address it connected from"),
        version=prop("string", "NFS version: 4.0, 4.1 or 4.2 (empty when not recorded)"),
        principal=prop(
            "string", "Who made it: flavour and uid, and the Kerberos principal under krb5"
        ),
        holds_state=prop("boolean", "It holds opens, locks or delegations"),
        head=prop("string", "The head whose client it is (empty with one head)"),
        last_seen_ns=prop(["integer", "null"], "When its record was written (ns since 1970)"),
        delegations=prop(
            "array",
            "Delegations it holds",
            items=obj(
                "A delegation",
                inode=prop("integer", "The file's inode"),
                path=prop("string", "A path to the file (empty when it was removed)"),
                type=prop("string", "read or write"),
                granted_ns=prop("integer", "When it was granted (ns since 1970)"),
                clientid=prop("string", "The client id it was granted to (hex)"),
                recalled_ns=prop(
                    ["integer", "null"],
                    "When the server recalled it (ns since 1970): a conflicting change waits "
                    "until it is returned, or revoked a lease later; null when not recalled",
                ),
            ),
        ),
    ),
    "SmbStatus": obj(
        "smbd's health and sessions",
        ("enabled", "running", "sessions"),
        enabled=prop("boolean", "The daemon has served SMB on this appliance (serve --smb-port)"),
        running=prop("boolean", "smbd is running"),
        pid=prop(["integer", "null"], "smbd's main process"),
        port=prop(["integer", "null"], "The SMB port smbd listens on"),
        sessions=prop(
            "array",
            "Connected sessions: user, machine (client address), protocol",
            items=obj(
                "A session",
                user=prop(["string", "null"], "SMB user"),
                machine=prop(["string", "null"], "Client address"),
                protocol=prop(["string", "null"], "SMB dialect"),
            ),
        ),
        error=prop(["string", "null"], "Why smbstatus gave no answer"),
        problem=prop(
            ["string", "null"],
            "Why the daemon cannot serve SMB (a Samba VFS module missing, ...), or null",
        ),
        shares=prop("integer", "SMB shares in the catalog"),
        shares_enabled=prop("integer", "Of them enabled"),
        users=prop("integer", "SMB users"),
    ),
    "Alert": obj(
        "An alert (engine/admin/alerts.py)",
        ("id", "kind", "state", "message"),
        id=prop("integer", "Alert id"),
        kind=prop(
            "string",
            "Source: drive_failed, host_lost, drive_io_errors, smart, redundancy_reduced, "
            "capacity, scrub_unrepairable, job_failed, catalog_unreachable, cert_expiry",
        ),
        key=prop("string", "Which instance of the kind, e.g. drive:3 (empty: one per kind)"),
        severity=prop("string", "warning or critical"),
        state=prop("string", "active, acknowledged or cleared"),
        message=prop("string", "What is wrong and what to do"),
        details=prop("object", "Facts of the finding"),
        first_ns=prop("integer", "Raised, " + NS),
        last_ns=prop("integer", "Last seen true, " + NS),
        acknowledged_ns=prop(["integer", "null"], "Acknowledged, " + NS),
        acknowledged_by=prop(["string", "null"], "Who acknowledged it"),
        cleared_ns=prop(["integer", "null"], "Cleared, " + NS),
    ),
    "TrashEntry": obj(
        "An entry in an export's trash",
        ("id", "trash_path", "bytes"),
        id=prop("integer", "Entry id (its inode number)"),
        name=prop("string", "Its name in the trash folder"),
        trash_path=prop("string", "Where it is now"),
        original_path=prop(["string", "null"], "Where it was deleted from"),
        deleted_ns=prop(["integer", "null"], "Deleted, " + NS),
        actor=prop(["string", "null"], "Who deleted it"),
        is_dir=prop("boolean", "A folder"),
        size=prop("integer", "The entry's own size attribute"),
        export=prop(["string", "null"], "Its export, null for the namespace root's trash"),
        trash_days=prop("integer", "Days entries stay in this trash"),
        expires_ns=prop(["integer", "null"], "When the daemon purges it, " + NS),
        bytes=prop("integer", "Bytes purging it frees (its files without another name)"),
        sizes_complete=prop("boolean", "False when the size walk stopped early (bytes: at least)"),
    ),
    "Restored": obj(
        "A restored trash entry",
        ("restored", "path"),
        restored=prop("integer", "The entry's id"),
        path=prop("string", "Where it is now"),
    ),
    "Dataset": obj(
        "A directory with snapshots or a snapshot schedule",
        ("path", "snapshots", "schedules"),
        path=prop("string", "The dataset's path"),
        snapshots=prop("integer", "How many snapshots"),
        schedules=prop("integer", "How many snapshot schedules"),
        referenced_bytes=prop("integer", "Bytes its snapshots reference (summed per snapshot)"),
        unique_bytes=prop("integer", "Sum of its snapshots' unique bytes"),
        pending_bytes=prop(
            "integer",
            "What the background reclaim of its deleted snapshots will still free (counted "
            "once each reclaim starts)",
        ),
        pending_deletions=prop("integer", "Deleted snapshots whose space is not reclaimed yet"),
    ),
    "Snapshot": obj(
        "A snapshot of a dataset, read-only at PATH/.snapshots/NAME",
        ("path", "name", "created", "referenced_bytes", "unique_bytes"),
        path=prop("string", "The dataset"),
        name=prop("string", "The snapshot's name"),
        id=prop("integer", "Snapshot id"),
        created=prop("integer", "Taken, " + NS),
        referenced_bytes=prop("integer", "Bytes its files reference (its logical size)"),
        unique_bytes=prop("integer", "Bytes only it references: what deleting it frees"),
        shared_bytes=prop(
            "integer",
            "Bytes it references that live files, clones or other snapshots reference too",
        ),
        files=prop("integer", "Inodes in its tree, its root included"),
        counted=prop(
            "integer",
            "When its space figures were counted, " + NS + " (0: due again; the daemon "
            "recounts every snapshots.space_recount_s, ?recount=true now)",
        ),
    ),
    "SnapshotPreview": obj(
        "What a snapshot change would do (nothing changed)",
        ("action", "path", "name", "summary"),
        action=prop("string", "create, delete or rollback"),
        path=prop("string", "The dataset"),
        name=prop("string", "The snapshot"),
        summary=prop("string", "What happens, in words"),
        files=prop("integer", "Files it holds (create: regular files now in the dataset)"),
        referenced_bytes=prop("integer", "Bytes it references (create: bytes it will hold)"),
        frees_bytes=prop(
            "integer", "delete: bytes it frees (its unique bytes), in the background reclaim"
        ),
        removed=prop("array", "rollback: paths made since the snapshot, removed"),
        restored=prop("array", "rollback: paths removed since, restored"),
        reverted=prop("array", "rollback: paths changed since, reverted"),
        more=prop("integer", "rollback: paths beyond the 200 listed per kind"),
        schedule_id=prop(["integer", "null"], "delete: the schedule that named it, if one did"),
    ),
    "SnapshotDeleted": obj(
        "A deleted snapshot",
        ("path", "name", "pending_deletions"),
        path=prop("string", "The dataset"),
        name=prop("string", "The snapshot"),
        pending_deletions=prop(
            "integer",
            "Deleted snapshots of the dataset whose space the daemon's background reclaim has "
            "not freed yet (this one included until its reclaim ends)",
        ),
    ),
    "SnapshotClone": obj(
        "A writable clone of a snapshot",
        ("path", "name", "new_path", "ino"),
        path=prop("string", "The dataset"),
        name=prop("string", "The snapshot"),
        new_path=prop("string", "Where the clone is"),
        ino=prop("integer", "The clone's root inode"),
    ),
    "SnapshotRollback": obj(
        "A dataset rolled back to a snapshot",
        ("path", "name"),
        path=prop("string", "The dataset"),
        name=prop("string", "The snapshot"),
        removed=prop("integer", "Paths made since the snapshot, removed (at most 200 counted)"),
        restored=prop("integer", "Paths restored (at most 200 counted)"),
        reverted=prop("integer", "Paths reverted (at most 200 counted)"),
    ),
    "SnapshotSchedule": obj(
        "Periodic snapshots of a dataset, named PREFIX-YYYY-MM-DDTHHMMZ",
        ("id", "path", "frequency", "prefix"),
        id=prop("integer", "Schedule id"),
        path=prop("string", "The dataset"),
        frequency=prop("string", "hourly, daily, weekly or interval"),
        interval_s=prop("integer", "Seconds between slots"),
        offset_s=prop("integer", "Seconds into the period at which a slot falls"),
        at=prop("string", "The same as text: :MM, HH:MM or 'Mon HH:MM' (UTC)"),
        prefix=prop("string", "Names start with it"),
        keep_last=prop(["integer", "null"], "The newest N are kept (null: no count rule)"),
        keep_for_s=prop(["integer", "null"], "Those younger are kept (null: no age rule)"),
        enabled=prop("boolean", "Whether the daemon takes it"),
        created_ns=prop("integer", "Created, " + NS),
        last_slot_s=prop("integer", "The newest slot taken, seconds since the epoch"),
        last_run_ns=prop(["integer", "null"], "Last run, " + NS),
        last_error=prop(["string", "null"], "What failed at the last run"),
        next_ns=prop("integer", "The next slot, " + NS),
        summary=prop("string", "The schedule in words"),
    ),
    "PlannedSnapshotAction": obj(
        "One thing a schedule run would do (preview) or did (run)",
        ("schedule_id", "path", "name", "action"),
        schedule_id=prop("integer", "Schedule id"),
        path=prop("string", "The dataset"),
        name=prop("string", "The snapshot"),
        action=prop("string", "create, delete, or skip (the schedule cannot run: see reason)"),
        reason=prop("string", "Why"),
        created_ns=prop("integer", "Taken (create: its slot), " + NS),
        unique_bytes=prop("integer", "What deleting it frees"),
        outcome=prop(["string", "null"], "After a run: done, skipped: ... or failed: ..."),
    ),
    "Deleted": obj("What was deleted", ("deleted",), deleted=prop("integer", "The id")),
    "DeletedName": obj("What was deleted", ("deleted",), deleted=prop("string", "The name")),
    "Csrf": obj(
        "The session's CSRF token",
        ("csrf_token", "header"),
        csrf_token=prop("string", "Token"),
        header=prop("string", "Header to send it in"),
    ),
}


ROUTES: dict[tuple[str, str], tuple[str, str]] = {  # (method, rule) -> (schema, what it is)
    ("GET", "/status"): ("Status", "the capacity, drive and throughput summary"),
    ("GET", "/drives"): ("Drive[]", "every drive"),
    ("GET", "/drives/<int:drive_id>"): (
        "Drive",
        "the drive, with its zones by state and band class",
    ),
    ("POST", "/drives/<int:drive_id>/actions"): (
        "ActionResult",
        "what the action did, and the job it queued if any",
    ),
    ("POST", "/drives"): ("Job", "the queued drive-add job"),
    ("POST", "/drives/<int:drive_id>/replace"): ("Job", "the queued drive-replace job"),
    ("GET", "/hosts"): ("ClusterHosts", "the cluster's hosts"),
    ("GET", "/hosts/<host>"): ("ClusterHost", "one host"),
    ("POST", "/hosts"): ("Job", "the queued host-join job"),
    ("POST", "/hosts/<host>/drain"): ("Job", "the queued host-drain job"),
    ("POST", "/hosts/<host>/remove"): ("Job", "the queued host-remove job"),
    ("POST", "/hosts/<host>/replace"): ("Job", "the queued host-replace job"),
    ("GET", "/retention/preview"): ("PlannedAction[]", "what a run would do, entry by entry"),
    ("POST", "/retention/run"): ("Job", "the queued retention job"),
    ("GET", "/trash"): ("TrashEntry[]", "every trash entry, oldest deletion first"),
    ("POST", "/trash/<int:entry_id>/restore"): ("Restored", "the entry and where it is now"),
    ("POST", "/trash/purge"): ("Job", "the queued trash-purge job"),
    ("GET", "/datasets"): ("Dataset[]", "every dataset"),
    ("GET", "/snapshots"): ("Snapshot[]", "the snapshots, oldest first per dataset"),
    ("GET", "/snapshots/preview"): ("SnapshotPreview", "what the change would do"),
    ("POST", "/snapshots"): ("Snapshot", "the new snapshot"),
    ("POST", "/snapshots/clone"): ("SnapshotClone", "the clone"),
    ("POST", "/snapshots/delete"): ("SnapshotDeleted", "the deleted snapshot"),
    ("POST", "/snapshots/rollback"): ("SnapshotRollback", "what the rollback changed"),
    ("POST", "/snapshots/archive"): ("Job", "the queued snapshot-archive job"),
    ("GET", "/snapshot-schedules/preview"): (
        "PlannedSnapshotAction[]",
        "what a run would do, snapshot by snapshot",
    ),
    ("POST", "/snapshot-schedules/run"): ("Job", "the queued snapshot-schedule job"),
    ("GET", "/jobs"): ("Job[]", "recent jobs, newest first"),
    ("GET", "/jobs/<int:job_id>"): ("Job", "the job"),
    ("POST", "/jobs"): ("Job", "the queued job"),
    ("POST", "/quotas/recount"): ("QuotaRecount", "the counters that were corrected"),
    ("GET", "/nfs/clients"): ("NfsClient[]", "recorded NFSv4 clients, newest first"),
    ("GET", "/smb/status"): ("SmbStatus", "smbd's health, sessions, shares and users"),
    ("GET", "/smb/users"): ("SmbUser[]", "every SMB user"),
    ("POST", "/smb/users"): ("SmbUser", "the new user, with its uid and gid"),
    ("GET", "/smb/users/<name>"): ("SmbUser", "the user"),
    ("PUT", "/smb/users/<name>/password"): ("SmbPasswordSet", "the user whose password changed"),
    ("DELETE", "/smb/users/<name>"): ("DeletedName", "the name of the removed user"),
    ("GET", "/tiers"): ("Tiers", "band classes, thresholds and pins"),
    ("PATCH", "/tiers/thresholds"): ("Thresholds", "the thresholds as changed"),
    ("POST", "/tiers/pins"): ("Pin", "the path, its class and how many inodes changed"),
    ("GET", "/alerts"): ("Alert[]", "alerts, open ones first"),
    ("POST", "/alerts/<int:alert_id>/ack"): ("Alert", "the alert, now acknowledged"),
    ("GET", "/events"): ("Event[]", "events, newest first"),
    ("GET", "/tokens"): ("Token[]", "every API token, without secrets"),
    ("POST", "/tokens"): ("NewToken", "the new token's secret (shown once)"),
    ("DELETE", "/tokens/<int:token_id>"): ("Deleted", "the id of the revoked token"),
    ("GET", "/csrf"): ("Csrf", "the session's CSRF token and the header to send it in"),
}


def for_route(method: str, rule: str) -> tuple[str, dict]:
    """(description, schema) of a route's success response; a route missing from ROUTES is
    documented as undescribed (tests/webui/test_api_responses.py fails on it)."""
    found = ROUTES.get((method, rule))
    if found is None:
        return "undescribed: add the route to webui/responses.py ROUTES", {}
    name, described = found
    return described, schema(name)


def schema(name: str) -> dict:
    """A response schema by name: ``Job``, or ``Job[]`` for a list of them."""
    if name.endswith("[]"):
        base = name[:-2]
        if base not in SCHEMAS:
            raise KeyError(
                f"response schema {base!r}: expected one of {', '.join(sorted(SCHEMAS))}"
            )
        return array_of(base, f"A list of {base}")
    if name not in SCHEMAS:
        raise KeyError(f"response schema {name!r}: expected one of {', '.join(sorted(SCHEMAS))}")
    return ref(name)
