"""The appliance configuration: one TOML file, validated when it loads.

Every option is declared once in ``OPTIONS`` with its type, default and a
description; the documented sample file (``shingle config sample``,
appliance/shingle.sample.toml) is rendered from these declarations, so the
documentation cannot drift from the code. A bad value raises
``ConfigError`` naming the key, the value and what was expected; the CLI
turns that into one line and exit code 2.
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.base.errors import ConfigError
from engine.base.units import format_size  # noqa: F401  (re-exported: callers use config.format_size)

SIZE_UNITS = {
    "": 1,
    "B": 1,
    "K": 1 << 10,
    "KIB": 1 << 10,
    "KB": 1000,
    "M": 1 << 20,
    "MIB": 1 << 20,
    "MB": 1000**2,
    "G": 1 << 30,
    "GIB": 1 << 30,
    "GB": 1000**3,
    "T": 1 << 40,
    "TIB": 1 << 40,
    "TB": 1000**4,
}
LOG_LEVELS = ("debug", "info", "warning", "error")
BAND_CLASSES = ("hot", "warm", "cold")


def parse_size(value: Any, key: str = "size") -> int:
    """'4GiB', '16MiB', '1048576' or an int -> bytes."""
    if isinstance(value, bool):
        raise ConfigError(key, value, "a size such as 4GiB, 16MiB or a byte count")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(key, value, "a size >= 0")
        return value
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(value))
    if not match or match.group(2).upper() not in SIZE_UNITS:
        raise ConfigError(key, value, "a size such as 4GiB, 16MiB or a byte count")
    return int(float(match.group(1)) * SIZE_UNITS[match.group(2).upper()])


@dataclass(frozen=True)
class Option:
    section: str
    name: str
    kind: str  # str | int | float | bool | size | port | level | host | choice
    default: Any
    doc: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple = ()

    @property
    def key(self) -> str:
        return f"{self.section}.{self.name}"


OPTIONS: list[Option] = [
    Option(
        "appliance",
        "data_dir",
        "str",
        ".",
        "Folder for the appliance's state; relative paths below are resolved against it "
        "(itself relative to this file's folder).",
    ),
    Option(
        "catalog",
        "url",
        "str",
        "sqlite:///catalog.db",
        "Catalog database: sqlite:///PATH (embedded default; relative PATH is under data_dir) "
        "or postgresql+psycopg://USER@HOST:PORT/DB when several processes or hosts share it.",
    ),
    Option(
        "catalog",
        "sqlite_synchronous",
        "choice",
        "normal",
        "SQLite durability for metadata commits: 'normal' (WAL; atomic after any crash, a power "
        "cut may lose the last commits) or 'full' (fsync every commit). Data commits behind a "
        "stable WRITE or COMMIT are always 'full'.",
        choices=("normal", "full"),
    ),
    Option(
        "storage",
        "drives_dir",
        "str",
        "drives",
        "Folder holding the emulated zoned drives (one sub-folder per drive, one file per zone).",
    ),
    Option(
        "storage",
        "reserve_zones",
        "int",
        2,
        "Zones per drive kept free for band cleaning, so cleaning can never deadlock on a full "
        "drive.",
        minimum=1,
        maximum=64,
    ),
    Option(
        "storage",
        "inline_write_bytes",
        "int",
        65536,
        "Durable writes up to this many bytes that would go to the hot class keep their bytes in "
        "the catalog's own transaction (one fsync round instead of two); tiering later folds them "
        "into erasure-coded stripes. 0 turns this off.",
        minimum=0,
        maximum=1 << 20,
    ),
    Option(
        "storage",
        "inline_budget_bytes",
        "int",
        256 << 20,
        "Most bytes kept in the catalog that way at once; past it small writes get three replicas "
        "on drives.",
        minimum=0,
    ),
    Option(
        "smr_model",
        "enabled",
        "bool",
        False,
        "Attach the SMR cost model to every drive (predicts seeks, media bytes and write "
        "amplification).",
    ),
    Option(
        "smr_model",
        "mode",
        "choice",
        "host-managed",
        "'host-managed' (non-sequential writes refused) or 'drive-managed' (band rewrites "
        "counted).",
        choices=("host-managed", "drive-managed"),
    ),
    Option(
        "smr_model", "seek_ms", "float", 8.0, "Average seek time of the modelled drive.", minimum=0
    ),
    Option("smr_model", "rotational_ms", "float", 4.2, "Average rotational latency.", minimum=0),
    Option("smr_model", "sequential_mib_s", "float", 235.0, "Sequential transfer rate.", minimum=1),
    Option(
        "nfs", "host", "host", "127.0.0.1", "Address the NFS server listens on (0.0.0.0 for all)."
    ),
    Option("nfs", "port", "port", 2049, "TCP port of the NFS server (2049 is the standard port)."),
    Option(
        "nfs",
        "max_record_size",
        "size",
        "5MiB",
        "Largest RPC record accepted; a larger one closes the connection. Also the largest reply: "
        "an NFSv4.1 session's ca_maxresponsesize, and an NFSv4.0 COMPOUND whose reply would grow "
        "past it stops with NFS4ERR_RESOURCE. Must exceed 1 MiB READ/WRITE plus headers.",
        minimum=1 << 20,
        maximum=64 << 20,
    ),
    Option("nfs", "lease_seconds", "int", 90, "NFSv4 lease time.", minimum=5, maximum=3600),
    Option(
        "nfs",
        "grace_seconds",
        "int",
        90,
        "Grace period after a restart during which clients reclaim their state.",
        minimum=0,
        maximum=3600,
    ),
    Option(
        "nfs",
        "portmap",
        "choice",
        "auto",
        "Port mapper for NFSv3 locking (clients find NLM through it): 'serve' answers it on "
        "portmap_port, 'register' registers NFS, MOUNT, NLM and NSM with the system rpcbind there, "
        "'auto' registers when an rpcbind answers and serves otherwise, 'off' answers it only on "
        "the NFS port (v3 clients then mount with nolock).",
        choices=("auto", "serve", "register", "off"),
    ),
    Option(
        "nfs",
        "udp",
        "bool",
        True,
        "Also answer the port mapper, MOUNT, NLM and NSM over UDP on the NFS port (and the port "
        "mapper on portmap_port): a client's sm-notify tells the server over UDP that it "
        "rebooted, which frees its NLM locks; rpcinfo -u and showmount ask over UDP. NFS itself "
        "is TCP only. Not with serve --heads (docs/nfs.md).",
    ),
    Option(
        "nfs",
        "portmap_port",
        "port",
        111,
        "Port of the port mapper: 111, where the Linux client looks for the server's lock manager.",
    ),
    Option(
        "nfs",
        "nsm_name",
        "str",
        "",
        "Name of this server in SM_NOTIFY after a restart (the name v3 clients mounted it by); "
        "empty: nfs.host, or the host name when listening on all addresses.",
    ),
    Option(
        "nfs",
        "client_rpcbind_port",
        "port",
        111,
        "Port of the clients' port mappers, asked for their NLM and NSM services (NLM_GRANTED of a "
        "blocked lock, SM_NOTIFY after a restart).",
    ),
    Option(
        "nfs",
        "krb5_keytab",
        "str",
        "",
        "Keytab holding the server's Kerberos key (nfs/HOST@REALM): set, the server accepts "
        "RPCSEC_GSS (exports with sec=krb5, krb5i, krb5p); empty, AUTH_SYS only.",
    ),
    Option(
        "nfs",
        "idmap_domain",
        "str",
        "",
        "Domain of NFSv4 owner names (user@domain), as the clients' idmapd.conf Domain: shingle "
        "sends names to Kerberos clients and takes names or numeric ids from any; empty: the "
        "host's DNS domain, else localdomain.",
    ),
    Option(
        "nfs",
        "krb5_principal",
        "str",
        "",
        "The service principal to accept as, e.g. nfs@nas.example.com; empty: any key in "
        "nfs.krb5_keytab.",
    ),
    # network limits against hostile or broken clients (appliance/nfs/onc/limits.py)
    Option(
        "nfs",
        "max_connections",
        "int",
        4096,
        "Most client connections at once; past it new connections are closed at once and one "
        "warning a minute is logged. The open-file limit is raised to fit.",
        minimum=1,
        maximum=1_000_000,
    ),
    Option(
        "nfs",
        "initial_buffer",
        "size",
        "16KiB",
        "Receive buffer each connection starts with; it grows only as bytes really arrive "
        "(a record's announced length allocates nothing).",
        minimum=1 << 10,
        maximum=256 << 10,
    ),
    Option(
        "nfs",
        "connection_budget",
        "size",
        "64MiB",
        "Request bytes one connection may hold (records arriving plus calls not yet answered); "
        "past it the connection stops reading, so TCP slows the client. At least "
        "max_record_size + 256KiB.",
        minimum=2 << 20,
    ),
    Option(
        "nfs",
        "total_budget",
        "size",
        "1GiB",
        "Request bytes all connections together may hold; past it connections that need more "
        "wait until calls are answered. At least connection_budget.",
        minimum=2 << 20,
    ),
    Option(
        "nfs",
        "idle_timeout_seconds",
        "float",
        300.0,
        "A connection with no NFSv4.1 session bound, no call outstanding and no record "
        "arriving is closed after this long without a byte (clients reconnect).",
        minimum=0.1,
    ),
    Option(
        "nfs",
        "session_idle_timeout_seconds",
        "float",
        3600.0,
        "The same for a connection an NFSv4.1 session is bound to.",
        minimum=0.1,
    ),
    Option(
        "nfs",
        "record_timeout_seconds",
        "float",
        30.0,
        "A record (RPC call) begun and not complete after this long closes its connection, "
        "whatever its byte rate (slow-sending clients hold memory).",
        minimum=0.1,
    ),
    Option(
        "nfs",
        "copy_offload_mib_s",
        "float",
        0.0,
        "Most MiB per second an asynchronous NFSv4.2 COPY moves on average (0: no cap; the "
        "copier still rests after each 64 MiB piece as long as the piece took).",
        minimum=0.0,
    ),
    Option(
        "nfs",
        "max_compound_ops",
        "int",
        64,
        "Most operations in one NFSv4 COMPOUND: in NFSv4.0 the operation past it answers "
        "NFS4ERR_RESOURCE (those before it run), and an NFSv4.1 session's ca_maxoperations is at "
        "most this (a longer COMPOUND gets NFS4ERR_TOO_MANY_OPS).",
        minimum=2,
        maximum=4096,
    ),
    Option(
        "nfs",
        "slot_replies_mib",
        "int",
        64,
        "Most MiB the NFSv4.1 session slots reserve for their replies, all sessions together: "
        "CREATE_SESSION grants each slot a cached reply size (at most 4 KiB) within it, fewer "
        "slots or a smaller size as it fills, then NFS4ERR_NOSPC; a retry of a request that "
        "changed something gets its kept reply (docs/nfs-state.md).",
        minimum=1,
        maximum=65536,
    ),
    Option(
        "smb",
        "port",
        "int",
        0,
        "TCP port of SMB (Samba sharing the namespace; 445 is the standard port); 0: no SMB. "
        "Under systemd shingle-smbd.service runs smbd as root; `serve --smb-port` overrides it.",
        minimum=0,
        maximum=65535,
    ),
    Option("smb", "host", "host", "127.0.0.1", "Address smbd listens on (0.0.0.0 for all)."),
    Option(
        "smb",
        "smbd",
        "choice",
        "auto",
        "Who runs smbd, which acts as each SMB user: 'daemon' (shingle serve itself, as root), "
        "'unit' (shingle-smbd.service, root, mounts the namespace and hands it to the daemon), "
        "'auto' (daemon when it runs as root, else unit).",
        choices=("auto", "daemon", "unit"),
    ),
    Option("webui", "host", "host", "127.0.0.1", "Address the admin web UI listens on."),
    Option("webui", "port", "port", 8080, "TCP port of the admin web UI."),
    Option("webui", "workers", "int", 2, "gunicorn worker processes.", minimum=1, maximum=64),
    Option(
        "webui",
        "secret_key_file",
        "str",
        "webui-secret.key",
        "File holding the key that signs session cookies (created by shingle init).",
    ),
    Option(
        "webui",
        "tls_cert_file",
        "str",
        "",
        "PEM certificate (chain) for HTTPS; with tls_key_file set the web UI serves only HTTPS, "
        "its session cookie is Secure and answers carry HSTS. Empty: plain HTTP (keep host on "
        "127.0.0.1 then). `shingle init --tls` makes a self-signed pair.",
    ),
    Option(
        "webui",
        "tls_key_file",
        "str",
        "",
        "PEM private key of tls_cert_file (mode 0600, readable by the web UI only).",
    ),
    Option(
        "smart",
        "smartctl",
        "str",
        "/usr/sbin/smartctl",
        "smartctl executable used for drive health.",
    ),
    Option("logging", "level", "level", "info", "Log level: debug, info, warning or error."),
    Option(
        "maintenance",
        "retention_interval_s",
        "int",
        3600,
        "How often retention rules run (0 disables the schedule).",
        minimum=0,
    ),
    Option(
        "maintenance",
        "tier_interval_s",
        "int",
        600,
        "How often tiering runs (0 disables).",
        minimum=0,
    ),
    Option(
        "maintenance",
        "clean_interval_s",
        "int",
        300,
        "How often band cleaning runs (0 disables).",
        minimum=0,
    ),
    Option(
        "maintenance",
        "scrub_interval_s",
        "int",
        604800,
        "How often a full scrub runs (0 disables).",
        minimum=0,
    ),
    Option("maintenance", "scrub_mib_s", "float", 50.0, "Scrub read rate limit.", minimum=0.1),
    Option(
        "maintenance",
        "rebuild_mib_s",
        "float",
        0.0,
        "Rebuild and drain write rate limit (drives' and hosts': `shingle rebuild`, `drives "
        "drain`, `cluster drain|remove`), in MiB/s; 0: as fast as the drives go.",
        minimum=0,
    ),
    Option(
        "maintenance",
        "metrics_interval_s",
        "float",
        10.0,
        "How often the daemon records its counters (NFS operations and bytes, media bytes) for "
        "charts.",
        minimum=0.1,
    ),
    Option(
        "maintenance",
        "trash_purge_interval_s",
        "int",
        86400,
        "How often trashed entries older than their export's trash_days are purged (0 disables).",
        minimum=0,
    ),
    Option(
        "maintenance",
        "drive_check_interval_s",
        "float",
        10.0,
        "How often each drive's folder or device is looked at: gone makes it missing, back "
        "online again (0 disables; I/O errors are noticed at once).",
        minimum=0,
    ),
    Option(
        "snapshots",
        "visible",
        "bool",
        False,
        "List DIR/.snapshots in DIR's directory listing (like ZFS snapdir=visible). Hidden by "
        "default: it is reached by name either way, and tools that walk a tree (rsync, du, "
        "rm -r) then do not descend into every snapshot.",
    ),
    Option(
        "snapshots",
        "reclaim_inodes_per_s",
        "float",
        50000.0,
        "Pace of the background reclaim of deleted snapshots (the daemon's snapshot-reclaim "
        "job): inode numbers freed per second on average, in chunks of 4,096 per catalog "
        "transaction, so other writers get the catalog in between (0: unpaced). A delete "
        "itself returns at once; its space shows as pending until then.",
        minimum=0,
    ),
    Option(
        "snapshots",
        "space_recount_s",
        "float",
        600.0,
        "How old a snapshot's referenced, unique and shared bytes may get before the daemon "
        "counts them again (its snapshot-space job: one read of each snapshot's extents). "
        "Listings show the stored figures, so a page load does not count them; changes of "
        "the live files age them (0: recounted only on demand, `snapshot list --recount`).",
        minimum=0,
    ),
    # alerts (engine/admin/alerts.py) and their delivery (engine/admin/notify.py)
    Option(
        "alerts",
        "interval_s",
        "float",
        60.0,
        "How often the daemon evaluates the alert sources (SMART at most every 10 min, the "
        "certificate every hour); 0 disables alerts.",
        minimum=0,
    ),
    Option(
        "alerts",
        "capacity_warn_percent",
        "float",
        80.0,
        "Pool fill (share of usable space written) that raises a warning alert.",
        minimum=1,
        maximum=100,
    ),
    Option(
        "alerts",
        "capacity_critical_percent",
        "float",
        90.0,
        "Pool fill that raises a critical alert (at least capacity_warn_percent).",
        minimum=1,
        maximum=100,
    ),
    Option(
        "alerts",
        "temperature_c",
        "float",
        55.0,
        "Drive temperature (SMART) that raises an alert.",
        minimum=20,
        maximum=100,
    ),
    Option(
        "alerts",
        "cert_warn_days",
        "float",
        21.0,
        "Alert when the web UI's TLS certificate (webui.tls_cert_file) expires within this "
        "many days.",
        minimum=0,
    ),
    Option("alerts", "mail_host", "str", "", "SMTP server for alert mail; empty: no mail."),
    Option("alerts", "mail_port", "port", 587, "SMTP port (587: submission with STARTTLS)."),
    Option("alerts", "mail_from", "str", "", "Sender address of alert mail."),
    Option("alerts", "mail_to", "str", "", "Recipients of alert mail, comma-separated."),
    Option("alerts", "mail_username", "str", "", "SMTP AUTH user; empty: no AUTH."),
    Option(
        "alerts",
        "mail_password_file",
        "str",
        "",
        "File holding the SMTP AUTH password (mode 0600; relative to data_dir).",
    ),
    Option(
        "alerts",
        "mail_starttls",
        "bool",
        True,
        "Upgrade the SMTP connection with STARTTLS before AUTH and sending (a server that does "
        "not offer it fails the delivery).",
    ),
    Option(
        "alerts", "mail_timeout_s", "float", 10.0, "Timeout of each SMTP network step.", minimum=0.5
    ),
    Option(
        "alerts",
        "webhook_url",
        "str",
        "",
        "URL that receives each alert as a JSON POST; empty: no webhook.",
    ),
    Option(
        "alerts", "webhook_timeout_s", "float", 5.0, "Timeout of each webhook POST.", minimum=0.5
    ),
    Option(
        "alerts",
        "webhook_retries",
        "int",
        4,
        "Further attempts after a failed POST.",
        minimum=0,
        maximum=20,
    ),
    Option(
        "alerts",
        "webhook_backoff_s",
        "float",
        2.0,
        "Wait before the first retry, doubled for each further one.",
        minimum=0,
    ),
    Option(
        "cluster",
        "etcd_endpoints",
        "str",
        "",
        "etcd client URLs, comma-separated (http://HOST:2379,...). Set: this host campaigns to "
        "be the maintenance leader (an etcd lease) and runs scheduled and queued jobs only "
        "while it leads, each catalog write fenced by its token (docs/cluster.md). Empty: one "
        "host, maintenance runs here as always.",
    ),
    Option(
        "cluster",
        "etcd_ca_file",
        "str",
        "",
        "The cluster CA's certificate (PEM): with https:// etcd endpoints, the only CA the "
        "members' certificates are checked against (`shingle cluster init --plan` sets it).",
    ),
    Option(
        "cluster",
        "etcd_cert_file",
        "str",
        "",
        "This head's client certificate for etcd (PEM, signed by the cluster CA): etcd's "
        "members ask for one (--client-cert-auth). Set with etcd_key_file.",
    ),
    Option(
        "cluster",
        "etcd_key_file",
        "str",
        "",
        "The private key of etcd_cert_file (mode 0600).",
    ),
    Option(
        "cluster",
        "name",
        "str",
        "",
        "This host's name in the leader election, status and the web UI; empty: the host name.",
    ),
    Option(
        "cluster",
        "lease_ttl_s",
        "float",
        10.0,
        "The maintenance leader's etcd lease: a leader that dies is replaced within about "
        "this long; a leader cut off from etcd stops this long after its last keepalive.",
        minimum=2,
        maximum=300,
    ),
    Option(
        "cluster",
        "host_gone_after_s",
        "float",
        0.0,
        "A host whose agent has not answered for this long is declared gone for good and its "
        "fragments are rebuilt on the other hosts (a host-remove job, paced by "
        "maintenance.rebuild_mib_s); 0: only when an admin says so (`shingle cluster remove`).",
        minimum=0,
    ),
    Option(
        "cluster",
        "mds_address",
        "str",
        "",
        "The metadata server's floating address, ADDRESS/PREFIX (IPv4, or IPv6 but not "
        "link-local): every head that sets it campaigns for an etcd lease, and the holder adds "
        "it to mds_interface and serves there (nfs.host must be 0.0.0.0, or :: for IPv6); a "
        "dead holder's address moves to a live head within about mds_lease_ttl_s "
        "(docs/cluster.md). A head with pnfs.role 'ds' given it never campaigns and leaves dead "
        "heads to the holder. Empty: no floating address.",
    ),
    Option(
        "cluster",
        "mds_interface",
        "str",
        "",
        "The network interface that carries mds_address on this head (eth0, bond0...).",
    ),
    Option(
        "cluster",
        "mds_lease_ttl_s",
        "float",
        5.0,
        "The etcd lease behind mds_address: a dead holder's address moves within about this "
        "long; a holder cut off from etcd drops the address at least a second before.",
        minimum=4,
        maximum=120,
    ),
    Option(
        "heads",
        "count",
        "int",
        1,
        "Head processes (each its own `shingle serve` with its own data_dir) that write the same "
        "drives over one catalog: each opens only the zones whose number modulo count is its "
        "index, so two heads never append to one zone (docs/pnfs.md). 1: this head alone.",
        minimum=1,
        maximum=256,
    ),
    Option(
        "heads",
        "processes",
        "int",
        1,
        "Head processes `shingle serve` runs on this host behind its one NFS port, each client "
        "host served by one of them (docs/heads.md); `serve --heads N` overrides. 1: one "
        "process.",
        minimum=1,
        maximum=256,
    ),
    Option(
        "heads",
        "index",
        "int",
        0,
        "This head's number among heads.count (0 to count - 1). Only head 0 runs maintenance "
        "jobs (scrub, cleaning, tiering, retention) unless [cluster] elects a leader.",
        minimum=0,
        maximum=255,
    ),
    Option(
        "pnfs",
        "role",
        "choice",
        "off",
        "pNFS FILES layout (docs/pnfs.md): 'mds' hands NFSv4.1 clients layouts that spread their "
        "READs and WRITEs over data_servers; 'ds' serves those READs and WRITEs (FILE_SYNC) as a "
        "data server, and every client as an ordinary head too; 'off' neither.",
        choices=("off", "mds", "ds"),
    ),
    Option(
        "pnfs",
        "data_servers",
        "str",
        "",
        "The metadata server's data servers, comma-separated HOST:PORT as clients reach them "
        "(IPv4, or IPv6 in brackets: [fd00::5]:2049; each a head with role 'ds' over the same "
        "catalog). Layouts stripe a "
        "file over them in this order.",
    ),
    Option(
        "pnfs",
        "address",
        "str",
        "",
        "A data server's own HOST:PORT as listed in the metadata server's data_servers: a data "
        "server left out of that list answers NFS4ERR_PNFS_NO_LAYOUT to I/O under another "
        "head's stateid, so clients fetch a new layout. Empty: nfs.host:nfs.port (a data server "
        "bound to every address must name it).",
    ),
    Option(
        "pnfs",
        "data_server_writes",
        "choice",
        "file_sync",
        "How a data server answers a layout's WRITEs: 'file_sync' (durable with size and mtime "
        "at the reply: the client sends no COMMIT and no LAYOUTCOMMIT; each WRITE is a flush) "
        "or 'unstable' (buffered into full stripes; the client COMMITs to each data server and "
        "sends LAYOUTCOMMIT to the metadata server). docs/pnfs.md has both measured.",
        choices=("file_sync", "unstable"),
    ),
]

BAND_CLASS_DEFAULTS: dict[str, dict[str, Any]] = {
    "hot": {"redundancy": "replicate", "copies": 3, "fragment_size": "1MiB"},
    "warm": {
        "redundancy": "ec",
        "k": 8,
        "m": 2,
        "backend": "isa_l_rs_vand",
        "fragment_size": "1MiB",
    },
    "cold": {
        "redundancy": "ec",
        "k": 8,
        "m": 2,
        "backend": "isa_l_rs_vand",
        "fragment_size": "1MiB",
        "compression": "zstd",
        "compression_level": 3,
    },
}
BAND_CLASS_DOC = {
    "redundancy": "'ec' (erasure-coded with pyeclib) or 'replicate' (whole copies)",
    "k": "data fragments per stripe (ec)",
    "m": "parity fragments per stripe (ec): any m drives of a stripe may be lost",
    "backend": "pyeclib backend (ec), e.g. isa_l_rs_vand",
    "copies": "number of copies on different drives (replicate)",
    "fragment_size": "bytes per fragment; a full stripe is k x fragment_size",
    "compression": "optional 'zstd': tiering compresses each stripe it writes into this class "
    "(stored raw when that saves under 1/16)",
    "compression_level": "zstd level 1-19 of that compression: higher packs tighter for more CPU",
}


def _check_nfs_limits(values: dict[str, Any]) -> None:
    """Limits that depend on each other (the NFS server's NetLimits checks the same)."""
    record, per_conn = values["nfs.max_record_size"], values["nfs.connection_budget"]
    if per_conn < record + (256 << 10):
        raise ConfigError(
            "nfs.connection_budget",
            per_conn,
            f"at least max_record_size + 256KiB ({record + (256 << 10)})",
        )
    if values["nfs.total_budget"] < per_conn:
        raise ConfigError(
            "nfs.total_budget",
            values["nfs.total_budget"],
            f"at least connection_budget ({per_conn})",
        )


def etcd_endpoints(value: str) -> list[str]:
    """The [cluster] etcd_endpoints list (empty: no cluster)."""
    return [url.strip() for url in value.split(",") if url.strip()]


def etcd_client(config: Config, timeout_s: float):
    """This host's etcd client from [cluster]: its endpoints, and TLS with the cluster CA and
    its client certificate when those are set."""
    from engine.cluster.etcd import EtcdClient, tls_context

    tls = None
    if config.get("cluster.etcd_ca_file"):
        cert = config.get("cluster.etcd_cert_file")
        tls = tls_context(
            str(config.resolve("cluster.etcd_ca_file")),
            str(config.resolve("cluster.etcd_cert_file")) if cert else "",
            str(config.resolve("cluster.etcd_key_file")) if cert else "",
        )
    return EtcdClient(
        etcd_endpoints(config.get("cluster.etcd_endpoints")), timeout_s=timeout_s, tls=tls
    )


def _check_cluster(values: dict[str, Any]) -> None:
    from engine.cluster.etcd import check_endpoint

    for url in etcd_endpoints(values["cluster.etcd_endpoints"]):
        try:
            check_endpoint(url)
        except ValueError:
            raise ConfigError(
                "cluster.etcd_endpoints", url, "comma-separated URLs http://HOST:PORT"
            ) from None
        if url.startswith("https:") and not values["cluster.etcd_ca_file"]:
            raise ConfigError("cluster.etcd_ca_file", "", f"the cluster CA's certificate for {url}")
    if bool(values["cluster.etcd_cert_file"]) != bool(values["cluster.etcd_key_file"]):
        key = "cluster.etcd_key_file" if values["cluster.etcd_cert_file"] else (
            "cluster.etcd_cert_file")  # fmt: skip
        raise ConfigError(key, "", "set together with the other of etcd_cert_file and key_file")


def _check_mds_address(values: dict[str, Any]) -> None:
    from appliance.mds_address import parse_address

    text = values["cluster.mds_address"]
    if not text:
        return
    try:
        address = parse_address(text)
    except ValueError as exc:
        raise ConfigError("cluster.mds_address", text, str(exc)) from None
    if not etcd_endpoints(values["cluster.etcd_endpoints"]):
        raise ConfigError("cluster.etcd_endpoints", "", "etcd URLs when mds_address is set")
    if not values["cluster.mds_interface"].strip():
        raise ConfigError("cluster.mds_interface", "", "the interface to put mds_address on")
    if address.version == 6 and values["nfs.host"] != "::":
        raise ConfigError(
            "nfs.host", values["nfs.host"], ":: when cluster.mds_address is an IPv6 address "
            "(the server must take connections to the address once it is added)",
        )  # fmt: skip
    if values["nfs.host"] not in ("0.0.0.0", "::"):
        raise ConfigError(
            "nfs.host", values["nfs.host"], "0.0.0.0 when cluster.mds_address is set (the "
            "server must take connections to the address once it is added)",
        )  # fmt: skip


def data_server_addresses(value: str, key: str = "pnfs.data_servers") -> list[tuple[str, int]]:
    """A comma-separated HOST:PORT list of IPv4 addresses or [IPv6] ones in brackets, as
    (host, port) pairs (host without brackets)."""
    found = []
    for item in (part.strip() for part in value.split(",")):
        if not item:
            continue
        host, _, port = item.rpartition(":")
        try:
            if host.startswith("[") and host.endswith("]"):
                host = host[1:-1]
                ipaddress.IPv6Address(host)
            else:
                ipaddress.IPv4Address(host)
            number = int(port)
        except ValueError:
            raise ConfigError(key, item, "IPV4:PORT or [IPV6]:PORT (comma-separated)") from None
        if not 0 < number <= 65535:
            raise ConfigError(key, item, "a TCP port 1-65535 after the colon")
        found.append((host, number))
    return found


def _check_heads(values: dict[str, Any]) -> None:
    if values["heads.index"] >= values["heads.count"]:
        raise ConfigError(
            "heads.index", values["heads.index"], f"below heads.count ({values['heads.count']})"
        )
    servers = data_server_addresses(values["pnfs.data_servers"])
    if values["pnfs.role"] == "mds" and not servers:
        raise ConfigError("pnfs.data_servers", "", "at least one HOST:PORT when pnfs.role is mds")
    if len(servers) > 4096:  # the Linux client takes at most 4096 stripe indices per device
        raise ConfigError("pnfs.data_servers", len(servers), "at most 4096 data servers")
    own = data_server_addresses(values["pnfs.address"], "pnfs.address")
    if values["pnfs.role"] == "ds" and not own and values["nfs.host"] in ("", "0.0.0.0", "::"):
        # its own address is how it finds itself in the metadata server's list: the wildcard
        # is in no list, so every I/O would get NFS4ERR_PNFS_NO_LAYOUT
        raise ConfigError(
            "pnfs.address",
            "",
            "this data server's HOST:PORT as the metadata server lists it "
            f"(nfs.host is {values['nfs.host'] or 'empty'}, every address)",
        )


def _check(option: Option, value: Any) -> Any:  # noqa: C901 - one flat test per option kind
    key, kind = option.key, option.kind
    if kind in ("str", "host", "choice", "level") and not isinstance(value, str):
        raise ConfigError(key, value, "a string")
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(key, value, "true or false")
        return value
    if kind == "int" or kind == "port":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(key, value, "a whole number")
        if kind == "port" and not 0 <= value <= 65535:
            raise ConfigError(key, value, "a TCP port 0-65535")
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(key, value, "a number")
        value = float(value)
    if kind == "size":
        value = parse_size(value, key)
    if kind == "choice" and value not in option.choices:
        raise ConfigError(key, value, "one of " + ", ".join(option.choices))
    if kind == "level" and value.lower() not in LOG_LEVELS:
        raise ConfigError(key, value, "one of " + ", ".join(LOG_LEVELS))
    if kind == "host":
        try:
            ipaddress.ip_address(value)
        except ValueError:
            if not re.fullmatch(r"[A-Za-z0-9.-]{1,253}", value):
                raise ConfigError(key, value, "an IP address or host name") from None
    if option.minimum is not None and value < option.minimum:
        raise ConfigError(key, value, f"at least {option.minimum:g}")
    if option.maximum is not None and value > option.maximum:
        raise ConfigError(key, value, f"at most {option.maximum:g}")
    return value


class Config:
    """Validated settings. ``config.get('nfs.port')``, plus resolved paths."""

    def __init__(self, values: dict[str, Any], band_classes: dict[str, dict], path: Path | None):
        self.values = values
        self.band_classes = band_classes
        self.path = path
        base = path.parent if path else Path.cwd()
        self.data_dir = (base / values["appliance.data_dir"]).resolve()

    def get(self, key: str) -> Any:
        return self.values[key]

    def resolve(self, key: str) -> Path:
        """A path option, resolved against data_dir."""
        return self.data_dir / self.values[key]

    @property
    def catalog_url(self) -> str:
        url = self.values["catalog.url"]
        prefix = "sqlite:///"
        if url.startswith(prefix) and not url.startswith(prefix + "/"):
            return prefix + str(self.data_dir / url[len(prefix) :])
        return url

    def policies(self) -> dict:
        """Band-class policies, validated by the engine (pyeclib backend present, k/m in range)."""
        from engine.coding.erasure import policy_from_dict

        return {name: policy_from_dict(name, opts) for name, opts in self.band_classes.items()}


def from_dict(  # noqa: C901 - sections, options, their cross-checks, band classes: one pass
    raw: dict[str, Any], path: Path | None = None
) -> Config:
    known = {opt.key: opt for opt in OPTIONS}
    sections = {opt.section for opt in OPTIONS} | {"band_classes"}
    values = {opt.key: _check(opt, opt.default) for opt in OPTIONS}
    for section, table in raw.items():
        if section not in sections:
            raise ConfigError(
                section,
                table if not isinstance(table, dict) else "[...]",
                "a known section: " + ", ".join(sorted(sections)),
            )
        if not isinstance(table, dict):
            raise ConfigError(section, table, "a table [" + section + "]")
        if section == "band_classes":
            continue
        for name, value in table.items():
            option = known.get(f"{section}.{name}")
            if option is None:
                names = ", ".join(o.name for o in OPTIONS if o.section == section)
                raise ConfigError(
                    f"{section}.{name}", value, f"a known option of [{section}]: {names}"
                )
            values[option.key] = _check(option, value)
    _check_nfs_limits(values)
    _check_cluster(values)
    _check_mds_address(values)
    _check_heads(values)
    if values["alerts.capacity_critical_percent"] < values["alerts.capacity_warn_percent"]:
        raise ConfigError(
            "alerts.capacity_critical_percent",
            values["alerts.capacity_critical_percent"],
            f"at least capacity_warn_percent ({values['alerts.capacity_warn_percent']:g})",
        )
    if bool(values["webui.tls_cert_file"]) != bool(values["webui.tls_key_file"]):
        key = "webui.tls_key_file" if values["webui.tls_cert_file"] else "webui.tls_cert_file"
        raise ConfigError(
            key,
            values[key],
            "set together with the other of tls_cert_file and "
            "tls_key_file (both for HTTPS, neither for HTTP)",
        )
    band_classes = {name: dict(opts) for name, opts in BAND_CLASS_DEFAULTS.items()}
    for name, table in raw.get("band_classes", {}).items():
        if name not in BAND_CLASSES:
            raise ConfigError(f"band_classes.{name}", "[...]", "one of " + ", ".join(BAND_CLASSES))
        if not isinstance(table, dict):
            raise ConfigError(f"band_classes.{name}", table, "a table")
        for key, value in table.items():
            if key not in BAND_CLASS_DOC:
                raise ConfigError(
                    f"band_classes.{name}.{key}", value, "one of " + ", ".join(BAND_CLASS_DOC)
                )
        band_classes[name].update(table)
    for name, opts in band_classes.items():
        if "fragment_size" in opts:
            opts["fragment_size"] = parse_size(
                opts["fragment_size"], f"band_classes.{name}.fragment_size"
            )
    return Config(values, band_classes, path)


def load(path: str | os.PathLike[str]) -> Config:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(
            "config file", str(path), "an existing file (create one with `shingle init DIR`)"
        ) from None
    except OSError as exc:
        raise ConfigError("config file", str(path), f"a readable file ({exc.strerror})") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("config file", str(path), f"valid TOML ({exc})") from None
    config = from_dict(raw, path)
    config.policies()  # validate erasure-coding policies now, not at the first write
    return config


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def render(overrides: dict[str, Any] | None = None, *, commented_defaults: bool = False) -> str:
    """The documented config file: every option with its description.

    ``overrides`` (key -> value) are written as set values; with
    ``commented_defaults`` the other options appear commented out."""
    overrides = overrides or {}
    lines = [
        "# shingle configuration. Every option is listed with its default.",
        "# Sizes accept units: 4GiB, 16MiB, 1048576.",
        "",
    ]
    section = None
    for opt in OPTIONS:
        if opt.section != section:
            section = opt.section
            lines += [f"[{section}]"]
        lines.append(f"# {opt.doc}")
        if opt.key in overrides:
            lines.append(f"{opt.name} = {_toml_value(overrides[opt.key])}")
        else:
            lines.append(
                f"{'# ' if commented_defaults else ''}{opt.name} = {_toml_value(opt.default)}"
            )
        if opt is OPTIONS[-1] or OPTIONS[OPTIONS.index(opt) + 1].section != section:
            lines.append("")
    lines.append("# Band classes: where data of each lifetime lives, and its redundancy.")
    for key, doc in BAND_CLASS_DOC.items():
        lines.append(f"#   {key}: {doc}")
    for name, opts in BAND_CLASS_DEFAULTS.items():
        lines.append(f"[band_classes.{name}]")
        for key, value in opts.items():
            lines.append(f"{'# ' if commented_defaults else ''}{key} = {_toml_value(value)}")
        lines.append("")
    return "\n".join(lines)


SAMPLE_PATH = Path(__file__).with_name("shingle.sample.toml")
