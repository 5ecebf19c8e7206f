"""What every NFSv4.1 operation works on: the COMPOUND's context (``Compound``: current
and saved file handle, stateids, session, identities) and the nodes file handles name.

File handles resolve through appliance.nfs.access, the checks NFSv3 shares."""

from __future__ import annotations

from appliance.nfs import access
from appliance.nfs.exports import ExportRule, PseudoDir, pseudo_ino
from appliance.nfs.fh import KIND_FILE, KIND_PSEUDO
from appliance.nfs.onc.rpc import RPCSEC_GSS
from appliance.nfs.state import Client, NfsError
from appliance.nfs.v4 import const as c
from appliance.nfs.v4.attrs import AttrError, AttrSubject
from appliance.nfs.v4.types import stateid4
from engine.catalog.models import DIR
from engine.namespace import Cred

CODES = access.Codes(
    NfsError,
    badhandle=c.NFS4ERR_BADHANDLE,
    stale=c.NFS4ERR_STALE,
    access=c.NFS4ERR_ACCESS,
    rofs=c.NFS4ERR_ROFS,
    io=c.NFS4ERR_IO,
    delay=c.NFS4ERR_DELAY,
    serverfault=c.NFS4ERR_SERVERFAULT,
    inval=c.NFS4ERR_INVAL,
    fbig=c.NFS4ERR_FBIG,
    errno_map=c.ERRNO_TO_NFS4,
    carries_status=(NfsError, AttrError),
    pseudo_handles=True,
)
ANONYMOUS_OTHER = b"\0" * 12
BYPASS_OTHER = b"\xff" * 12
PSEUDO_CRED = Cred(65534, 65534)


class Node:
    """A current or saved file handle: a pseudo-root directory or a file of an export."""

    __slots__ = ("export", "ino", "generation", "pseudo", "fh")

    def __init__(
        self,
        export: ExportRule | None,
        ino: int,
        generation: int = 1,
        pseudo: PseudoDir | None = None,
        fh: bytes | None = None,
    ):
        self.export, self.ino, self.generation = export, ino, generation
        self.pseudo, self.fh = pseudo, fh  # fh: the handle's bytes, once known


class PseudoAttr:
    """Attributes of a pseudo-root directory (read-only, owned by root)."""

    __slots__ = (
        "ino",
        "type",
        "mode",
        "uid",
        "gid",
        "size",
        "nlink",
        "rdev",
        "atime_ns",
        "mtime_ns",
        "ctime_ns",
        "btime_ns",
        "change",
    )

    def __init__(self, node: PseudoDir, boot_ns: int, generation: int):
        self.ino, self.type, self.mode, self.uid, self.gid = node.ino, DIR, 0o555, 0, 0
        self.size, self.nlink, self.rdev = 4096, 2 + len(node.children), 0
        self.atime_ns = self.mtime_ns = self.ctime_ns = self.btime_ns = boot_ns
        self.change = generation


class Compound:
    """Per-COMPOUND context handed to every operation handler."""

    minor = c.MINOR_VERSION  # compound40.Compound40 is NFSv4.0's

    def __init__(self, server, conn_state: dict, rpc_cred, address: str):
        self.server = server
        self.ns = server.namespace
        self.state = server.state
        self.conn_state = conn_state
        self.rpc_cred = rpc_cred
        self.address = address
        # owners as user@domain under Kerberos, where the client maps names (as knfsd does);
        # numeric under AUTH_SYS, the Linux client's default there
        self.owner_names = rpc_cred.flavor == RPCSEC_GSS
        self.cur: Node | None = None
        self.saved: Node | None = None
        self.cur_stateid = None
        self.saved_stateid = None
        self.session = None
        self.slot = None
        self.client: Client | None = None
        # the size the results may reach (set by SEQUENCE) and the error past it
        self.reply_limit = 1 << 62
        self.reply_too_big = c.NFS4ERR_REP_TOO_BIG
        self.cache_room = 0  # what the results may take for the slot to keep the reply
        self._creds: dict = {}

    # -- identities ---------------------------------------------------------------
    def cred(self, node: Node):
        export = node.export
        if export is None:  # the pseudo-root is read-only: nobody needs more than "nobody"
            return PSEUDO_CRED
        key = export.id
        cred = self._creds.get(key)
        if cred is None:
            r = self.rpc_cred
            cred = export.cred(r.uid, r.gid, r.gids)
            self._creds[key] = cred
        return cred

    def need_client(self):
        if self.client is None:
            raise NfsError(c.NFS4ERR_OP_NOT_IN_SESSION, "no SEQUENCE in this COMPOUND")
        return self.client

    # -- file handles ---------------------------------------------------------------
    def need_fh(self) -> Node:
        if self.cur is None:
            raise NfsError(c.NFS4ERR_NOFILEHANDLE, "no current file handle")
        return self.cur

    def need_file(self) -> Node:
        node = self.need_fh()
        if node.pseudo is not None:
            raise NfsError(c.NFS4ERR_ISDIR, "the pseudo-root holds only directories")
        return node

    def need_writable(self, node: Node) -> None:
        if node.pseudo is not None:
            raise NfsError(c.NFS4ERR_ROFS, "the pseudo-root is read-only")
        assert node.export is not None  # a node outside the pseudo-root is in an export
        access.need_writable(node.export, CODES)

    def fh_of(self, node: Node) -> bytes:
        if node.fh is None:
            codec = self.server.handles
            if node.pseudo is not None:
                node.fh = codec.pack(KIND_PSEUDO, 0, node.pseudo.ino, 0)
            else:
                assert node.export is not None  # a node outside the pseudo-root is in an export
                node.fh = codec.pack(KIND_FILE, node.export.id, node.ino, node.generation)
        return node.fh

    def node_for_export(self, rule: ExportRule) -> Node:
        attr = access.enter_export(self.server, rule, self.address, CODES)
        return Node(rule, rule.root_ino, attr.generation)

    def root_node(self) -> Node:
        exports = self.server.exports
        if exports.root_export is not None:
            return self.node_for_export(exports.root_export)
        return Node(None, exports.root.ino, 0, pseudo=exports.root)

    def node_from_fh(self, data) -> Node:
        fh, rule, found = access.resolve(self.server, data, self.address, CODES)
        if rule is None:
            assert isinstance(found, PseudoDir)  # no export: a pseudo-root directory
            return Node(None, found.ino, 0, pseudo=found, fh=bytes(data))
        return Node(rule, fh.ino, fh.generation, fh=bytes(data))

    # -- attributes -------------------------------------------------------------------
    def subject(self, node: Node, attr=None) -> AttrSubject:
        server = self.server
        if node.pseudo is not None:
            attr = PseudoAttr(node.pseudo, server.boot_ns, server.exports_generation)
            return AttrSubject(
                attr,
                self.fh_of(node),
                (server.handles.fsid, 0),
                attr.ino,
                server,
                minor=self.minor,
                owner_names=self.owner_names,
            )
        if attr is None:
            attr = self.ns.getattr(node.ino)
        assert node.export is not None  # a node outside the pseudo-root is in an export
        mounted_on = attr.ino
        if attr.ino == node.export.root_ino:
            mounted_on = pseudo_ino(node.export.parts)
        return AttrSubject(
            attr,
            self.fh_of(node),
            (server.handles.fsid, node.export.id),
            mounted_on,
            server,
            minor=self.minor,
            owner_names=self.owner_names,
        )

    # -- stateids ---------------------------------------------------------------------
    def stateid(self, sid):
        """The stateid an operation names, resolving the 4.1 "current stateid"."""
        if sid.other == ANONYMOUS_OTHER and sid.seqid == 1:
            if self.cur_stateid is None:
                raise NfsError(c.NFS4ERR_BAD_STATEID, "current stateid used but none is set")
            return self.cur_stateid
        return sid

    @staticmethod
    def is_special(sid) -> bool:
        return sid.other == ANONYMOUS_OTHER or sid.other == BYPASS_OTHER

    def set_stateid(self, st) -> object:
        sid = stateid4.cls(st.seqid, st.other)
        self.cur_stateid = sid
        return sid
