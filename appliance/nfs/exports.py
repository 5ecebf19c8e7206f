"""The NFS server's export table: exports loaded through engine.admin.exports, client address
checks, identity squashing and the NFSv4 pseudo-root that shows the export names as
directories."""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import threading
from dataclasses import dataclass, field

from appliance.nfs.onc.rpc import UNMAPPED
from engine.admin import exports as export_service
from engine.admin.exports import DEFAULT_NAME, EXPORTS, SQUASH_MODES  # noqa: F401 - re-exported
from engine.namespace import Cred

AUTH_NONE, AUTH_SYS = 0, 1  # RFC 5531's flavour numbers (appliance/nfs/onc/rpc.py)
# sec= names -> flavour numbers: AUTH_SYS and the Kerberos 5 pseudo-flavours (RFC 2623)
FLAVOR_NUMBERS = {"sys": AUTH_SYS, "krb5": 390003, "krb5i": 390004, "krb5p": 390005}

log = logging.getLogger("shingle.nfs.exports")

PSEUDO_ROOT_INO = 1


@dataclass
class ExportRule:
    id: int
    name: str
    path: str
    networks: list
    read_only: bool
    squash: str
    anon_uid: int
    anon_gid: int
    root_ino: int = 0
    delegations: bool = True  # NFSv4 clients may get read delegations of its files
    # the flavours clients may use, in the export's order of preference (SECINFO, MNT list them)
    flavors: tuple[int, ...] = (AUTH_SYS,)
    # every export's folder and the namespace root: what the anonymous uid must not own
    export_folders: frozenset[int] = frozenset()
    _allowed: dict = field(default_factory=dict, repr=False)

    @property
    def parts(self) -> tuple[str, ...]:
        return tuple(p for p in self.name.split("/") if p)

    def admits(self, sec: int) -> bool:
        """Whether a call in flavour ``sec`` may use the export (AUTH_NONE goes with sys)."""
        return sec in self.flavors or (sec == AUTH_NONE and AUTH_SYS in self.flavors)

    def allows(self, address: str) -> bool:
        hit = self._allowed.get(address)
        if hit is None:
            hit = self._allowed[address] = self._check(address)
        return hit

    def _check(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address.split("%")[0])
        except ValueError:
            return False
        if ip.version == 6 and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return any(ip.version == net.version and ip in net for net in self.networks)

    def cred(self, uid: int, gid: int, groups: tuple[int, ...]) -> Cred:
        if uid == UNMAPPED:  # a Kerberos principal without a local user: this export's nobody
            uid, gid, groups = self.anon_uid, self.anon_gid, ()
        elif self.squash == "all_squash" or (self.squash == "root_squash" and uid == 0):
            uid, gid, groups = self.anon_uid, self.anon_gid, ()
        elif self.squash == "root_squash":
            # the root group too, in the supplementary groups as well (as knfsd does): a user
            # in group 0 must not get root's group access through the export
            if gid == 0:
                gid = self.anon_gid
            if 0 in groups:
                groups = tuple(self.anon_gid if g == 0 else g for g in groups)
        if uid == self.anon_uid and uid != 0:
            # the export folders are the anonymous uid's only so that Linux clients let a
            # squashed root open its files there (engine.admin.exports.prepare_new_root): owner
            # rights over them (chmod, the sticky bit's exception) would reach every squashed
            # client, and a client's own "nobody" (which its root can become) is the same uid
            return Cred(uid, gid, groups, self.export_folders)
        return Cred(uid, gid, groups)


@dataclass
class PseudoDir:
    """A directory of the pseudo-root: the path to it and its entries."""

    parts: tuple[str, ...]
    ino: int
    children: dict = field(default_factory=dict)  # name -> PseudoDir | ExportRule
    parent: PseudoDir | None = None


def pseudo_ino(parts: tuple[str, ...]) -> int:
    if not parts:
        return PSEUDO_ROOT_INO
    digest = hashlib.blake2b("/".join(parts).encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") >> 2) | (1 << 61)  # stable across restarts


def parse_networks(text: str) -> list:
    networks = []
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError as exc:
            raise ValueError(
                f"export client {item!r}: expected an address or CIDR like 10.0.0.0/8"
            ) from exc
    return networks


def rule_from_row(row) -> ExportRule:
    name = "/" + "/".join(p for p in row.name.split("/") if p)
    if row.access not in ("rw", "ro"):
        raise ValueError(f"export {row.name}: access {row.access!r}: expected 'rw' or 'ro'")
    if row.squash not in SQUASH_MODES:
        raise ValueError(
            f"export {row.name}: squash {row.squash!r}: expected one of {SQUASH_MODES}"
        )
    return ExportRule(
        int(row.id),
        name,
        row.path or "/",
        parse_networks(row.clients),
        row.access == "ro",
        row.squash,
        int(row.anon_uid),
        int(row.anon_gid),
        delegations=bool(getattr(row, "delegations", True)),
        flavors=parse_flavors(row.sec or "sys"),
    )


def parse_flavors(text: str) -> tuple[int, ...]:
    """'krb5p:krb5:sys' -> (390005, 390003, 1)."""
    try:
        return tuple(FLAVOR_NUMBERS[part] for part in text.split(":") if part)
    except KeyError as exc:
        raise ValueError(
            f"sec {text!r}: {exc.args[0]!r} is not one of {sorted(FLAVOR_NUMBERS)}"
        ) from None


def default_rule() -> ExportRule:
    return ExportRule(
        1, DEFAULT_NAME, "/", parse_networks("0.0.0.0/0,::/0"), False, "root_squash", 65534, 65534
    )


def ensure_default_export(catalog, name: str = DEFAULT_NAME) -> None:
    """Insert the default export (namespace root, rw, any client, root_squash)
    when the exports table is empty (``shingle init``)."""
    export_service.ensure_default(catalog, name)


class ExportTable:
    """The current exports and pseudo tree; ``refresh`` reloads the catalog."""

    def __init__(self, catalog, namespace):
        self.catalog = catalog
        self.namespace = namespace
        self.by_id: dict[int, ExportRule] = {}
        self.root = PseudoDir((), PSEUDO_ROOT_INO)
        self.pseudo_by_ino: dict[int, PseudoDir] = {PSEUDO_ROOT_INO: self.root}
        self.root_export: ExportRule | None = None  # an export named "/" replaces the pseudo-root
        self._lock = threading.Lock()
        self.refresh()

    def refresh(self) -> None:
        rows = export_service.list_exports(self.catalog, enabled_only=True, order_by="id")
        rules = []
        for row in rows:
            try:
                rule = rule_from_row(row)
                rule.root_ino = self.namespace.resolve(rule.path).ino
            except Exception as exc:  # noqa: BLE001 - one bad export must not hide the others
                log.error("export %s skipped: %s", row.name, exc)
                continue
            rules.append(rule)
        if not rows:
            rule = default_rule()
            rule.root_ino = self.namespace.root_ino
            rules.append(rule)
        folders = frozenset({self.namespace.root_ino, *(r.root_ino for r in rules)})
        for rule in rules:
            rule.export_folders = folders
        root = PseudoDir((), PSEUDO_ROOT_INO)
        pseudo = {PSEUDO_ROOT_INO: root}
        root_export = None
        for rule in rules:
            parts = rule.parts
            if not parts:
                root_export = rule
                continue
            node = root
            for depth, part in enumerate(parts[:-1]):
                child = node.children.get(part)
                if not isinstance(child, PseudoDir):
                    child = PseudoDir(
                        parts[: depth + 1], pseudo_ino(parts[: depth + 1]), parent=node
                    )
                    node.children[part] = child
                    pseudo[child.ino] = child
                node = child
            node.children[parts[-1]] = rule
        with self._lock:
            self.by_id = {r.id: r for r in rules}
            self.root, self.pseudo_by_ino, self.root_export = root, pseudo, root_export

    def pseudo_parent_of(self, rule: ExportRule) -> PseudoDir:
        node = self.root
        for part in rule.parts[:-1]:
            node = node.children[part]
        return node

    def visible(self, node: PseudoDir, address: str) -> dict:
        """Entries of a pseudo directory that lead to an export this client may use."""
        out = {}
        for name, child in node.children.items():
            if isinstance(child, ExportRule):
                if child.allows(address):
                    out[name] = child
            elif self._any_allowed(child, address):
                out[name] = child
        return out

    def _any_allowed(self, node: PseudoDir, address: str) -> bool:
        return any(
            child.allows(address)
            if isinstance(child, ExportRule)
            else self._any_allowed(child, address)
            for child in node.children.values()
        )
