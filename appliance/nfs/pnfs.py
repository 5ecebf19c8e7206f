"""pNFS FILES layout (RFC 8881 sections 12 and 13): this head's role, the data servers, the
layouts handed out. The operations are in appliance/nfs/v4/ops/pnfs.py; docs/pnfs.md has the
design.

- The metadata server (role "mds") lists its data servers in [pnfs] data_servers and
  publishes that list with a generation number in the catalog's settings at start
  (``MEMBERSHIP_KEY``): the generation moves when the list changed, and the device id of a
  layout carries it, so GETDEVICEINFO of an older device id is NFS4ERR_NOENT.
- A data server (role "ds") is a whole head over the same catalog and drives: it serves the
  READs and WRITEs a layout sends it under the metadata server's stateids (which it cannot
  check: RFC 8881 13.9.1, loose coupling) after checking the caller's own rights, and answers
  NFS4ERR_PNFS_NO_LAYOUT once it is no longer in the published list, so the client drops the
  layout and asks again.
- Data servers that are heads of several over the catalog announce which head serves their
  address; the metadata server leaves a data server out of new layouts while its head has no
  row in nfs_heads (dead: expired by another head after a lease, or not started), and takes it
  back when the head joins again (``follow``): a new generation each time.
- Layouts are whole-file hints any data server can serve: nothing is recalled. Their state
  (stateid, seqid per client and file) lives in this process only: a restart of the metadata
  server makes clients start over, as it does for their opens."""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from sqlalchemy import select

from appliance.nfs.state import NfsError
from appliance.nfs.v4 import const as c
from engine.base.blocking import WouldBlock, blocking_forbidden
from engine.catalog.models import NfsHead, Setting

log = logging.getLogger("shingle.nfs")
MEMBERSHIP_KEY = "pnfs.membership"
# + a head's name: the address of the data server that head is (``Pnfs.announce``)
ANNOUNCE_PREFIX = "pnfs.data_server."
MEMBERSHIP_TTL_S = 2.0  # how long a data server trusts what it read of the membership
MAX_LAYOUTS = 65536  # layout states kept; the oldest go first (a client then asks again)
ROLES = ("off", "mds", "ds")


def netaddr(host: str, port: int) -> tuple[str, str]:
    """(netid, universal address) of a TCP endpoint (RFC 5665): tcp h1.h2.h3.h4.p1.p2 for
    IPv4, tcp6 and the IPv6 address's text followed by .p1.p2 for IPv6."""
    return ("tcp6" if ":" in host else "tcp"), f"{host}.{port >> 8}.{port & 0xFF}"


@dataclass(slots=True)
class Layout:
    other: bytes
    clientid: int
    ino: int
    seqid: int


class Pnfs:
    """What one head does for pNFS: its role, and as metadata server its data servers, the
    current device id and the layout states."""

    def __init__(
        self,
        role: str = "off",
        data_servers: list[tuple[str, int]] | None = None,
        *,
        stripe_unit: int = 8 << 20,
        address: tuple[str, int] | None = None,
        stable_writes: bool = True,
    ):
        if role not in ROLES:
            raise ValueError(f"pNFS role {role!r}: expected one of {ROLES}")
        if stripe_unit <= 0 or stripe_unit & ~c.NFL4_UFLG_STRIPE_UNIT_SIZE_MASK:
            raise ValueError(f"stripe unit {stripe_unit}: expected a multiple of 64 below 4 GiB")
        self.role = role
        self.data_servers = list(data_servers or [])
        if role == "mds" and not self.data_servers:
            raise ValueError("a pNFS metadata server needs at least one data server")
        self.stripe_unit = stripe_unit
        self.address = address
        # a data server answers a layout's WRITEs FILE_SYNC ([pnfs] data_server_writes)
        self.stable_writes = stable_writes
        self.generation = 0
        # the device new layouts name and the data servers it lists, replaced as one
        self.device: tuple[bytes, tuple[tuple[str, int], ...]] = (
            bytes(c.NFS4_DEVICEID4_SIZE),
            tuple(self.data_servers),
        )
        self.announced = False  # a data server: its head's announcement is written
        self._lock = threading.Lock()  # the layout states
        self._layouts: OrderedDict[bytes, Layout] = OrderedDict()
        self._by_file: dict[tuple[int, int], Layout] = {}
        self._next = 0
        self._tag = b"pNFS"
        # a data server's view of the membership: (read at, listed?)
        self._member: tuple[float, bool] | None = None

    @property
    def is_mds(self) -> bool:
        return self.role == "mds"

    @property
    def is_ds(self) -> bool:
        return self.role == "ds"

    @property
    def layout_types(self) -> list[int]:
        """The fs_layout_type attribute: the FILES layout on a metadata server only."""
        return [c.LAYOUT4_NFSV4_1_FILES] if self.is_mds else []

    def exchange_flags(self) -> int:
        """EXCHANGE_ID's pNFS role flags (RFC 8881 13.1). The Linux client refuses
        USE_PNFS_MDS beside USE_NON_PNFS, and takes a data server only with USE_PNFS_DS."""
        if self.is_mds:
            return c.EXCHGID4_FLAG_USE_PNFS_MDS
        if self.is_ds:
            return c.EXCHGID4_FLAG_USE_PNFS_DS | c.EXCHGID4_FLAG_USE_NON_PNFS
        return c.EXCHGID4_FLAG_USE_NON_PNFS

    @property
    def device_id(self) -> bytes:
        return self.device[0]

    # -- membership ------------------------------------------------------------------------
    def publish(self, catalog, serving: list[tuple[str, int]] | None = None) -> None:
        """Record the data servers new layouts name (``serving``; at the metadata server's
        start, every one configured) in the catalog, with a generation that moves when the
        list changed; the device id follows it."""
        serving = list(self.data_servers if serving is None else serving)
        listed = [f"{host}:{port}" for host, port in serving]
        raw = catalog.get_setting(MEMBERSHIP_KEY)
        before = json.loads(raw) if raw else {}
        generation = int(before.get("generation", 0))
        if before.get("data_servers") != listed:
            generation += 1
            catalog.set_setting(
                MEMBERSHIP_KEY, json.dumps({"generation": generation, "data_servers": listed})
            )
            log.info("pNFS data servers, generation %d: %s", generation, ", ".join(listed))
        self.generation = generation
        digest = hashlib.sha256(json.dumps(listed).encode()).digest()[:8]
        self.device = (generation.to_bytes(8, "big") + digest, tuple(serving))

    def announce(self, catalog, head: str) -> None:
        """A data server that is one of several heads: ``head`` serves this address (the
        metadata server's ``follow`` reads it); once per start."""
        if self.address is not None and not self.announced:
            catalog.set_setting(ANNOUNCE_PREFIX + head, f"{self.address[0]}:{self.address[1]}")
            self.announced = True

    def follow(self, catalog) -> bool:
        """The metadata server, at each of its heartbeats: a data server whose announcing head
        has no row in nfs_heads (expired after a lease of silence, or not started) leaves the
        device of new layouts, and comes back once its head joins again; a data server no head
        announced stays. True when the list changed (and was published)."""

        def read(conn):
            live = set(conn.execute(select(NfsHead.__table__.c.name)).scalars())
            table = Setting.__table__
            rows = conn.execute(
                select(table.c.key, table.c.value).where(table.c.key.like(ANNOUNCE_PREFIX + "%"))
            ).all()
            return live, rows

        live, rows = catalog.read(read)
        up = {value for key, value in rows if key[len(ANNOUNCE_PREFIX) :] in live}
        down = {value for key, value in rows if key[len(ANNOUNCE_PREFIX) :] not in live} - up
        serving = [ds for ds in self.data_servers if f"{ds[0]}:{ds[1]}" not in down]
        if tuple(serving) == self.device[1]:
            return False
        for host, port in set(self.device[1]) - set(serving):
            log.warning(
                "pNFS data server %s:%d left out of new layouts: its head is dead", host, port
            )
        for host, port in set(serving) - set(self.device[1]):
            log.info("pNFS data server %s:%d back in new layouts: its head joined", host, port)
        self.publish(catalog, serving)
        return True

    def check_member(self, catalog) -> None:
        """A data server's check before I/O under another head's stateid: NFS4ERR_PNFS_NO_LAYOUT
        once the published list leaves it out (the client's layout is old). Read from the
        catalog at most every MEMBERSHIP_TTL_S; on the event loop a stale view hands the
        operation to a worker first."""
        seen = self._member
        if seen is None or time.monotonic() - seen[0] > MEMBERSHIP_TTL_S:
            if blocking_forbidden():
                raise WouldBlock("the pNFS membership is read from the catalog")
            raw = catalog.get_setting(MEMBERSHIP_KEY)
            listed = json.loads(raw)["data_servers"] if raw else []
            me = f"{self.address[0]}:{self.address[1]}" if self.address else None
            seen = self._member = (time.monotonic(), me in listed)
        if not seen[1]:
            raise NfsError(
                c.NFS4ERR_PNFS_NO_LAYOUT,
                "this data server is not in the metadata server's list: the layout is old",
            )

    # -- layouts ---------------------------------------------------------------------------
    @staticmethod
    def first_stripe_index(ino: int, count: int) -> int:
        """Files start on different data servers (``count`` of them), so small files spread
        too."""
        return ino % count

    def grant(self, clientid: int, ino: int, stateid_other: bytes | None) -> Layout:
        """The layout state of (client, file) with its seqid moved on, made when new.
        ``stateid_other``: the layout stateid the client sent, None for an open, lock or
        delegation stateid (its first LAYOUTGET of the file)."""
        with self._lock:
            found: Layout | None
            if stateid_other is not None:
                found = self._find(stateid_other, clientid, ino)
            else:
                found = self._by_file.get((clientid, ino))
            if found is None:
                self._next += 1
                other = self._tag + self._next.to_bytes(8, "big")
                found = Layout(other, clientid, ino, 0)
                self._layouts[other] = self._by_file[(clientid, ino)] = found
                while len(self._layouts) > MAX_LAYOUTS:
                    _, old = self._layouts.popitem(last=False)
                    self._by_file.pop((old.clientid, old.ino), None)
            found.seqid = (found.seqid % 0xFFFFFFFF) + 1
            self._layouts.move_to_end(found.other)
            return found

    def is_layout_stateid(self, other: bytes) -> bool:
        return other[:4] == self._tag

    def find(self, other: bytes, clientid: int, ino: int) -> Layout:
        with self._lock:
            return self._find(other, clientid, ino)

    def _find(self, other: bytes, clientid: int, ino: int) -> Layout:
        found = self._layouts.get(other)
        if found is None or found.clientid != clientid:
            raise NfsError(c.NFS4ERR_BAD_STATEID, "no such layout stateid of this client")
        if found.ino != ino:
            raise NfsError(c.NFS4ERR_BAD_STATEID, "layout stateid of another file")
        return found

    def give_back(self, layout: Layout) -> None:
        """A whole-file LAYOUTRETURN: the client holds no layout of the file any more."""
        with self._lock:
            self._layouts.pop(layout.other, None)
            self._by_file.pop((layout.clientid, layout.ino), None)

    def give_back_all(self, clientid: int) -> int:
        """LAYOUTRETURN of every layout of a client (RETURN_FSID: this server has one file
        system per export, all on the one catalog; RETURN_ALL)."""
        with self._lock:
            mine = [lo for lo in self._layouts.values() if lo.clientid == clientid]
            for lo in mine:
                self._layouts.pop(lo.other, None)
                self._by_file.pop((lo.clientid, lo.ino), None)
            return len(mine)

    def held(self) -> int:
        with self._lock:
            return len(self._layouts)
