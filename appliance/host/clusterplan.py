"""The cluster's plan (`shingle cluster plan`) and what each host of it needs to run its part,
rendered for Debian's own packages and units (`shingle cluster render`):

- an etcd member: ``/etc/default/etcd``, the environment file of etcd-server's etcd.service
  (``ETCD_*`` variables: name, data folder, peer and client URLs, the initial cluster);
- a PostgreSQL member: ``/etc/patroni/config.yml``, the config of the patroni package's
  patroni.service (as the postgres user: Debian's postgresql-15 binaries, the member's
  folder, the DCS being the plan's etcd members, synchronous mode), and the post-bootstrap
  script Patroni runs once on the first primary, which makes the heads' catalog role and
  database.

The plan is one TOML file (0600: it holds the passwords), made once and copied to every host:

    name = "shingle"                          # Patroni's scope, etcd's cluster token
    [etcd]
    members = { etcd1 = "10.0.0.11", ... }    # member name -> address
    data_dir = "/var/lib/etcd/shingle"        # not etcd-server's default member's folder
    [postgres]
    members = { pg1 = "10.0.0.21", ... }
    folder = "/var/lib/postgresql/15/shingle" # data/, pgpass and the Unix socket of a member
    bin_dir = "/usr/lib/postgresql/15/bin"
    clients = "0.0.0.0/0"                     # where heads connect from (with a password)
    superuser_password = "..."  replication_password = "..."  catalog_password = "..."
    [patroni]
    ttl = 30  loop_wait = 10  retry_timeout = 10
    [tls]
    folder = "/etc/shingle/cluster-tls"       # the cluster CA and each host's certificate

With ``[tls]`` (every plan `shingle cluster plan` makes now) etcd speaks only TLS, to its
clients and to its peers, and asks each for a certificate of the cluster's CA
(appliance/host/clustertls.py); render copies a member's certificate and key next to its
config, readable by etcd or postgres only. A plan without ``[tls]`` (made before) renders plain
HTTP. ``[etcd] added`` names members added to the running cluster (`shingle cluster
add-host`): they start with initial-cluster-state ``existing``. docs/cluster.md has the steps."""

from __future__ import annotations

import ipaddress
import json
import re
import secrets
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380
POSTGRES_PORT = 5432
PATRONI_PORT = 8008
CATALOG_USER = "shingle"
CATALOG_DATABASE = "shingle"
MEMBER_NAME = re.compile(r"^[a-z][a-z0-9-]{0,62}$")
POST_BOOTSTRAP = "shingle-post-bootstrap"


class PlanError(ValueError):
    """A plan that cannot be used: one line saying what and where."""


@dataclass
class Plan:
    etcd: dict[str, str]
    postgres: dict[str, str]
    superuser_password: str
    replication_password: str
    catalog_password: str
    name: str = "shingle"
    etcd_data_dir: str = "/var/lib/etcd/shingle"
    postgres_folder: str = "/var/lib/postgresql/15/shingle"
    postgres_bin: str = "/usr/lib/postgresql/15/bin"
    clients: str = "0.0.0.0/0"
    patroni: dict[str, int] = field(
        default_factory=lambda: {"ttl": 30, "loop_wait": 10, "retry_timeout": 10}
    )
    tls_folder: str = ""  # empty: plain HTTP (a plan made before TLS)
    etcd_added: list[str] = field(default_factory=list)

    @property
    def scheme(self) -> str:
        return "https" if self.tls_folder else "http"

    def tls_file(self, name: str) -> Path:
        """A file of the plan's TLS folder (ca.crt, NAME.crt, NAME.key, client.crt ...)."""
        return Path(self.tls_folder) / name

    def client_tls(self) -> tuple[str, str, str] | None:
        """(CA, client certificate, its key) for etcd clients of the plan; None: plain HTTP."""
        if not self.tls_folder:
            return None
        return tuple(str(self.tls_file(n)) for n in ("ca.crt", "client.crt", "client.key"))  # type: ignore[return-value]

    def address(self, member: str) -> str:
        return self.etcd.get(member) or self.postgres[member]

    # -- what heads use ------------------------------------------------------------------------
    @property
    def etcd_endpoints(self) -> list[str]:
        return [f"{self.scheme}://{a}:{ETCD_CLIENT_PORT}" for a in self.etcd.values()]

    @property
    def catalog_url(self) -> str:
        """Every PostgreSQL member; libpq keeps the one that takes writes (docs/cluster.md)."""
        hosts = "&".join(f"host={a}:{POSTGRES_PORT}" for a in self.postgres.values())
        return (
            f"postgresql+psycopg://{CATALOG_USER}:{self.catalog_password}@/{CATALOG_DATABASE}"
            f"?{hosts}&target_session_attrs=read-write"
        )

    def roles(self, member: str) -> list[str]:
        return [role for role, members in (("etcd", self.etcd), ("postgres", self.postgres))
                if member in members]  # fmt: skip

    # -- an etcd member ------------------------------------------------------------------------
    def etcd_environment(self, member: str, etc: Path = Path("/etc")) -> str:
        """/etc/default/etcd of ``member``: etcd-server's unit reads it (EnvironmentFile)."""
        address, scheme = self.etcd[member], self.scheme
        peers = ",".join(f"{n}={scheme}://{a}:{ETCD_PEER_PORT}" for n, a in self.etcd.items())
        values = {
            "ETCD_NAME": member,
            "ETCD_DATA_DIR": self.etcd_data_dir,
            "ETCD_LISTEN_PEER_URLS": f"{scheme}://{address}:{ETCD_PEER_PORT}",
            "ETCD_INITIAL_ADVERTISE_PEER_URLS": f"{scheme}://{address}:{ETCD_PEER_PORT}",
            # also loopback: etcdctl and a head on this host without naming the address
            "ETCD_LISTEN_CLIENT_URLS": f"{scheme}://{address}:{ETCD_CLIENT_PORT},"
            f"{scheme}://127.0.0.1:{ETCD_CLIENT_PORT}",
            "ETCD_ADVERTISE_CLIENT_URLS": f"{scheme}://{address}:{ETCD_CLIENT_PORT}",
            "ETCD_INITIAL_CLUSTER": peers,
            # a member added to a running cluster joins it (`etcdctl member add` came first)
            "ETCD_INITIAL_CLUSTER_STATE": "existing" if member in self.etcd_added else "new",
            "ETCD_INITIAL_CLUSTER_TOKEN": self.name,
            "ETCD_ENABLE_V2": "false",
        }
        if self.tls_folder:
            folder = etc / "etcd" / "tls"
            ca, cert, key = (str(folder / n) for n in ("ca.crt", f"{member}.crt", f"{member}.key"))
            # clients and peers alike must show a certificate of the cluster's CA; a peer's
            # must also name the address it connects from (etcd checks it)
            values.update({
                "ETCD_CERT_FILE": cert, "ETCD_KEY_FILE": key, "ETCD_TRUSTED_CA_FILE": ca,
                "ETCD_CLIENT_CERT_AUTH": "true",
                "ETCD_PEER_CERT_FILE": cert, "ETCD_PEER_KEY_FILE": key,
                "ETCD_PEER_TRUSTED_CA_FILE": ca, "ETCD_PEER_CLIENT_CERT_AUTH": "true",
            })  # fmt: skip
        lines = [f"# made by shingle cluster render from the cluster plan: etcd member {member}"]
        lines += [f'{key}="{value}"' for key, value in values.items()]
        return "\n".join(lines) + "\n"

    # -- a PostgreSQL member under Patroni -----------------------------------------------------
    def patroni_config(self, member: str, post_bootstrap: Path, etc: Path = Path("/etc")) -> dict:
        """/etc/patroni/config.yml of ``member`` (JSON, which is YAML)."""
        address = self.postgres[member]
        etcd3: dict = {"hosts": [f"{a}:{ETCD_CLIENT_PORT}" for a in self.etcd.values()]}
        if self.tls_folder:
            folder = etc / "patroni" / "tls"
            etcd3.update(
                protocol="https",
                cacert=str(folder / "ca.crt"),
                cert=str(folder / f"{member}.crt"),
                key=str(folder / f"{member}.key"),
            )
        folder = Path(self.postgres_folder)
        trusted = [f"{a}/32" for a in dict.fromkeys(self.postgres.values())]
        hba = ["local all all peer"]
        hba += [f"host replication replicator {net} scram-sha-256" for net in trusted]
        hba += [f"host all postgres {net} scram-sha-256" for net in trusted]  # pg_rewind
        hba += [f"host {CATALOG_DATABASE} {CATALOG_USER} {self.clients} scram-sha-256"]
        return {
            "scope": self.name,
            "name": member,
            "restapi": {
                "listen": f"{address}:{PATRONI_PORT}",
                "connect_address": f"{address}:{PATRONI_PORT}",
            },
            "etcd3": etcd3,
            "bootstrap": {
                "dcs": {
                    **self.patroni,
                    "maximum_lag_on_failover": 1 << 20,
                    # a commit is acknowledged once a standby has it too; only that standby
                    # may be promoted (docs/cluster.md)
                    "synchronous_mode": True,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "use_slots": True,
                        "parameters": {
                            "wal_log_hints": "on",
                            "max_connections": 200,
                            "wal_keep_size": "256MB",
                            "hot_standby": "on",
                            "password_encryption": "scram-sha-256",
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, "data-checksums"],
                "post_bootstrap": str(post_bootstrap),
            },
            "postgresql": {
                "listen": f"{address}:{POSTGRES_PORT}",
                "connect_address": f"{address}:{POSTGRES_PORT}",
                "data_dir": str(folder / "data"),
                "bin_dir": self.postgres_bin,
                "pgpass": str(folder / "pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres", "password": self.superuser_password},
                    "replication": {
                        "username": "replicator",
                        "password": self.replication_password,
                    },
                },
                # the member's own socket folder: Debian's default cluster keeps
                # /var/run/postgresql
                "parameters": {"unix_socket_directories": str(folder)},
                # Patroni's own connections: the socket, so the first bootstrap (initdb's
                # local trust, no password set yet) and then peer need no address's line
                "use_unix_socket": True,
                "pg_hba": hba,
                # a new replica's base backup asks for an immediate checkpoint: a spread one
                # keeps it waiting up to checkpoint_timeout x checkpoint_completion_target
                "basebackup": {"checkpoint": "fast"},
                # an old primary that cannot be rewound is cloned again
                "remove_data_directory_on_rewind_failure": True,
                "remove_data_directory_on_diverged_timelines": True,
            },
            # a hung member is restarted by the kernel where a watchdog device exists
            "watchdog": {"mode": "automatic"},
        }

    def post_bootstrap_script(self) -> str:
        """Run by Patroni once, on the first primary, with the superuser's connection string:
        the heads' role and their catalog database (migrated by the first head's init)."""
        psql = Path(self.postgres_bin) / "psql"
        role = f"CREATE ROLE {CATALOG_USER} LOGIN PASSWORD '{self.catalog_password}'"
        database = f"CREATE DATABASE {CATALOG_DATABASE} OWNER {CATALOG_USER}"
        return (
            "#!/bin/sh\n# made by shingle cluster render: the heads' catalog role and database\n"
            f'set -e\n{psql} "$1" -v ON_ERROR_STOP=1 -c "{role}"\n'
            f'{psql} "$1" -v ON_ERROR_STOP=1 -c "{database}"\n'
        )

    # -- the file ------------------------------------------------------------------------------
    def to_toml(self) -> str:
        def table(members: dict[str, str]) -> str:
            return "{ " + ", ".join(f"{n} = {json.dumps(a)}" for n, a in members.items()) + " }"

        patroni = "\n".join(f"{k} = {v}" for k, v in self.patroni.items())
        added = f"added = {json.dumps(self.etcd_added)}\n" if self.etcd_added else ""
        tls = f"\n[tls]\nfolder = {json.dumps(self.tls_folder)}\n" if self.tls_folder else ""
        return (
            "# the cluster's plan (shingle cluster plan): copy it to every host of the cluster;\n"
            "# it holds the PostgreSQL passwords, so keep it 0600\n"
            f"name = {json.dumps(self.name)}\n\n"
            f"[etcd]\nmembers = {table(self.etcd)}\n"
            f"data_dir = {json.dumps(self.etcd_data_dir)}\n{added}\n"
            f"[postgres]\nmembers = {table(self.postgres)}\n"
            f"folder = {json.dumps(self.postgres_folder)}\n"
            f"bin_dir = {json.dumps(self.postgres_bin)}\n"
            f"clients = {json.dumps(self.clients)}\n"
            f"superuser_password = {json.dumps(self.superuser_password)}\n"
            f"replication_password = {json.dumps(self.replication_password)}\n"
            f"catalog_password = {json.dumps(self.catalog_password)}\n\n"
            f"[patroni]\n{patroni}\n{tls}"
        )


def parse_members(text: str, what: str) -> dict[str, str]:
    """``NAME=ADDRESS,...`` -> {name: address}; names unique, addresses IP addresses."""
    members: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, address = item.partition("=")
        if not sep:
            raise PlanError(f"{what} {item!r}: expected NAME=ADDRESS")
        members[name.strip()] = address.strip()
    return check_members(members, what)


def check_members(members: dict[str, str], what: str, *, odd: bool = True) -> dict[str, str]:
    if not members:
        raise PlanError(f"{what}: no members")
    for name, address in members.items():
        if not MEMBER_NAME.match(name):
            raise PlanError(f"{what} member {name!r}: expected a lowercase name (a-z, 0-9, -)")
        try:
            ipaddress.ip_address(address)
        except ValueError:
            raise PlanError(f"{what} member {name}: {address!r} is not an IP address") from None
    if odd and len(members) % 2 == 0:
        raise PlanError(
            f"{what}: {len(members)} members; an odd number (3, 5) survives as many losses "
            "with one member fewer"
        )
    return members


def new_plan(etcd: str, postgres: str, **options) -> Plan:
    return Plan(
        etcd=parse_members(etcd, "--etcd"),
        postgres=parse_members(postgres, "--postgres"),
        superuser_password=secrets.token_urlsafe(24),
        replication_password=secrets.token_urlsafe(24),
        catalog_password=secrets.token_urlsafe(24),
        **options,
    )


def load_plan(path: Path) -> Plan:
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise PlanError(f"{path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise PlanError(f"{path}: not TOML ({exc})") from None
    try:
        etcd, postgres = data["etcd"], data["postgres"]
        plan = Plan(
            # even counts load: a member added or removed one at a time passes through them
            etcd=check_members(dict(etcd["members"]), f"{path} [etcd]", odd=False),
            postgres=check_members(dict(postgres["members"]), f"{path} [postgres]", odd=False),
            superuser_password=postgres["superuser_password"],
            replication_password=postgres["replication_password"],
            catalog_password=postgres["catalog_password"],
        )
    except (KeyError, TypeError) as exc:
        raise PlanError(f"{path}: missing {exc} (made by `shingle cluster plan`?)") from None
    plan.name = data.get("name", plan.name)
    plan.etcd_data_dir = etcd.get("data_dir", plan.etcd_data_dir)
    plan.postgres_folder = postgres.get("folder", plan.postgres_folder)
    plan.postgres_bin = postgres.get("bin_dir", plan.postgres_bin)
    plan.clients = postgres.get("clients", plan.clients)
    plan.tls_folder = data.get("tls", {}).get("folder", "")
    plan.etcd_added = [n for n in etcd.get("added", []) if n in plan.etcd]
    for member in set(plan.etcd) & set(plan.postgres):
        if plan.etcd[member] != plan.postgres[member]:
            raise PlanError(f"{path}: {member} has two addresses ({plan.etcd[member]}, "
                            f"{plan.postgres[member]}): one host, one address")  # fmt: skip
    plan.patroni = {**plan.patroni, **data.get("patroni", {})}
    for key, value in plan.patroni.items():
        if key not in ("ttl", "loop_wait", "retry_timeout") or type(value) is not int or value < 1:
            raise PlanError(f"{path} [patroni] {key} = {value!r}: expected ttl, loop_wait or "
                            "retry_timeout, whole seconds")  # fmt: skip
    if plan.patroni["loop_wait"] + 2 * plan.patroni["retry_timeout"] > plan.patroni["ttl"]:
        raise PlanError(f"{path} [patroni]: loop_wait + 2 x retry_timeout must not pass ttl")
    return plan


@dataclass
class Rendered:
    """A file ``render`` writes: where, what, its mode and owner (a system user or None)."""

    path: Path
    text: str
    mode: int
    owner: str | None


def render(plan: Plan, member: str, etc: Path = Path("/etc")) -> list[Rendered]:
    """The files ``member`` needs (an etcd member, a PostgreSQL member, or both), under
    ``etc``."""
    roles = plan.roles(member)
    if not roles:
        known = ", ".join(dict.fromkeys([*plan.etcd, *plan.postgres]))
        raise PlanError(f"{member!r} is no member of the plan (its members: {known})")
    files = []
    if "etcd" in roles:
        files.append(
            Rendered(etc / "default" / "etcd", plan.etcd_environment(member, etc), 0o644, None)
        )
        files += _tls_copies(plan, member, etc / "etcd" / "tls", "etcd")
    if "postgres" in roles:
        script = etc / "patroni" / POST_BOOTSTRAP
        config = json.dumps(plan.patroni_config(member, script, etc), indent=1) + "\n"
        files.append(Rendered(etc / "patroni" / "config.yml", config, 0o600, "postgres"))
        files.append(Rendered(script, plan.post_bootstrap_script(), 0o700, "postgres"))
        files += _tls_copies(plan, member, etc / "patroni" / "tls", "postgres")
    return files


def _tls_copies(plan: Plan, member: str, folder: Path, owner: str) -> list[Rendered]:
    """The CA's certificate and the member's own pair, for the service that reads them (the
    key readable by that user only: on a host with both roles etcd and postgres each get a
    copy)."""
    if not plan.tls_folder:
        return []
    copies = []
    for name, mode in (("ca.crt", 0o644), (f"{member}.crt", 0o644), (f"{member}.key", 0o600)):
        source = plan.tls_file(name)
        try:
            text = source.read_text()
        except OSError as exc:
            raise PlanError(
                f"{source}: {exc.strerror} (copy the plan's TLS folder {plan.tls_folder} with "
                "the plan: ca.crt and this host's certificate and key)"
            ) from None
        copies.append(Rendered(folder / name, text, mode, owner))
    return copies


ROLES = ("etcd", "postgres")


def add_member(plan: Plan, name: str, address: str, roles: list[str]) -> None:
    """``name`` at ``address`` added to the plan's ``roles`` (`shingle cluster add-host`)."""
    unknown = [role for role in roles if role not in ROLES]
    if not roles or unknown:
        raise PlanError(f"--role {','.join(roles)}: expected etcd, postgres or etcd,postgres")
    check_members({name: address}, name, odd=False)
    for role in roles:
        if name in getattr(plan, role):
            raise PlanError(f"{name} is a {role} member of the plan already")
    known = {**plan.etcd, **plan.postgres}
    if name in known and known[name] != address:
        raise PlanError(f"{name} is in the plan at {known[name]}, not {address}: one host, "
                        "one address")  # fmt: skip
    taken = [n for n, a in known.items() if a == address and n != name]
    if taken:
        raise PlanError(f"{address} is {taken[0]}'s address in the plan")
    for role in roles:
        getattr(plan, role)[name] = address
    if "etcd" in roles:
        plan.etcd_added.append(name)


def remove_member(plan: Plan, name: str) -> list[str]:
    """``name`` out of every table of the plan; the roles it had."""
    roles = plan.roles(name)
    if not roles:
        raise PlanError(f"{name!r} is no member of the plan")
    for role in roles:
        if len(getattr(plan, role)) == 1:
            raise PlanError(f"{name} is the plan's last {role} member")
    for role in roles:
        del getattr(plan, role)[name]
    plan.etcd_added = [n for n in plan.etcd_added if n != name]
    return roles


def write_plan(plan: Plan, path: Path) -> None:
    """Replace the plan file at once (a new file, 0600 from its first byte, renamed over)."""
    import os

    temporary = path.with_name(f".{path.name}.new")
    temporary.unlink(missing_ok=True)
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(plan.to_toml())
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)
