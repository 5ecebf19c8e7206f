"""Helpers for NFS tests: a real catalog (SQLite), a real data path on 10
emulated zone-file drives, the NFS server in a thread, and real clients
(nfs-rs and nfs4fs) connected over 127.0.0.1."""

from __future__ import annotations

import threading
from contextlib import contextmanager

from migrated import migrate_sqlite

from appliance.nfs.server import NfsServerThread
from engine.catalog import Catalog
from engine.catalog.models import Export
from engine.coding.erasure import policy_from_dict
from engine.datapath import DataPath
from engine.drives import format_emulated
from engine.namespace import Namespace

MiB = 1 << 20


def add_export(
    catalog,
    name="/export",
    path="/",
    clients="127.0.0.1/32",
    access="rw",
    squash="no_root_squash",
    anon_uid=65534,
    anon_gid=65534,
    sec="sys",
):
    catalog.run(
        lambda conn: conn.execute(
            Export.__table__.insert().values(
                name=name,
                path=path,
                clients=clients,
                access=access,
                squash=squash,
                anon_uid=anon_uid,
                anon_gid=anon_gid,
                trash_days=7,
                enabled=True,
                sec=sec,
            )
        )
    )


class Stack:
    """Catalog + data path + namespace, re-openable to model a server restart."""

    def __init__(
        self, tmp_path, *, drive_size: int, zone_size: int, fragment_size: int, url: str = ""
    ):
        """``url``: a catalog already upgraded (default: a new SQLite one in ``tmp_path``)."""
        self.url = url or f"sqlite:///{tmp_path}/catalog.db"
        if not url:
            migrate_sqlite(self.url)
        self.catalog = Catalog(self.url)
        format_emulated(self.catalog, tmp_path / "drives", 10, drive_size, zone_size)
        self.fragment_size = fragment_size
        self.data = None
        self.namespace = None
        self.open()

    def open(self):
        if self.data is None:
            policies = {"warm": policy_from_dict("warm", {"fragment_size": self.fragment_size})}
            self.data = DataPath(self.catalog, policies, reserve_zones=2)
            self.namespace = Namespace(self.catalog, self.data)
        return self

    def close_data(self):
        if self.data is not None:
            self.data.close()
            self.data = None

    def close(self):
        self.close_data()
        self.catalog.close()


def start_server(stack, **kwargs):
    kwargs.setdefault("port", 0)
    return NfsServerThread(stack.namespace, stack.catalog, **kwargs).start()


def nfsrs(
    port: int, uid: int = 0, gid: int = 0, export: str = "export", version: str = "4.1", **kwargs
):
    """nfs-rs as uid:gid at ``version`` (4.1, 4.0, or 3 with MOUNT on the same port)."""
    import nfs_rs

    query = f"version={version}" + (f"&nfsport={port}&mountport={port}" if version == "3" else "")
    return nfs_rs.Client.connect(
        f"nfs://127.0.0.1:{port}/{export}?{query}",
        nfs_port=port,
        noresvport=True,
        uid=uid,
        gid=gid,
        connect_timeout=20,
        operation_timeout=60,
        **kwargs,
    )


_nfs4fs_open: list = []


def nfs4fs(port: int, root: str = "export"):
    import fsspec

    fs = fsspec.filesystem(
        "nfs4",
        host=f"127.0.0.1:{port}",
        root=root,
        auth="auth_sys",
        minor_version=1,
        skip_instance_cache=True,
    )
    _nfs4fs_open.append(fs)
    return fs


def drop_nfs4fs():
    # nfs4fs 0.3.11 spends 20 s in its native shutdown before DESTROY_SESSION;
    # abandoning the client keeps the suite fast (the server's lease reaps it)
    while _nfs4fs_open:
        fs = _nfs4fs_open.pop()
        try:
            fs._client._abandon_after_fork()
        except Exception:  # noqa: BLE001 - best effort: the slow path still works
            pass


@contextmanager
def every_worker_busy(server):
    """Every NFS worker thread of ``server`` waits until the block ends (a real saturated pool)."""
    nfs = server.server
    release = threading.Event()
    started = threading.Barrier(nfs.workers + 1)

    def hold():
        started.wait(10)
        release.wait(30)

    held = [nfs.pool.submit(hold) for _ in range(nfs.workers)]
    try:
        started.wait(10)
        yield
    finally:
        release.set()
        for fut in held:
            fut.result(10)
