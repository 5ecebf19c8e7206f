"""`shingle serve --heads 2` (appliance/heads.py, docs/heads.md): one port, two head processes
over one SQLite catalog and one set of drives, each client host served by the head its address
picks; data written through one head read through the other; a head killed with SIGKILL is
started again under its index and its client goes on; SIGTERM stops every process; status
shows the heads; bad combinations are refused before anything starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from nfs4_rawclient import RawClient, open_args
from pgserver import free_port
from sqlalchemy import select
from test_delegations import CallbackClient

from appliance import config as config_mod
from appliance.daemonlock import process_alive
from appliance.host import doctor
from appliance.nfs import portmap as pmap
from appliance.nfs.handoff import head_for
from appliance.nfs.nlm.nsm import NsmMonitor
from appliance.nfs.v4 import const as c
from appliance.nfs.v4 import types as t
from engine.catalog import Catalog
from engine.catalog.models import Setting

READ = c.OPEN4_SHARE_ACCESS_READ
CONFIG_EXTRA = 'portmap = "serve"\nportmap_port = 0\ngrace_seconds = 3\n'


def shingle(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "appliance.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def appliance_config(tmp_path):
    home = tmp_path / "appliance"
    run = shingle("init", str(home), "--drive-size", "64MiB", "--zone-size", "4MiB")
    assert run.returncode == 0, run.stderr
    path = home / "shingle.toml"
    path.write_text(path.read_text().replace("[nfs]\n", "[nfs]\n" + CONFIG_EXTRA, 1))
    return path


def heads_status(home) -> dict:
    return json.loads((home / "heads.json").read_text())


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout:.0f} s: {what}")


def owner_major(port: int, source: str) -> bytes:
    """The server owner the head serving ``source`` answers EXCHANGE_ID with."""
    client = RawClient(port, source=source)
    try:
        args = t.ARGS[c.OP_EXCHANGE_ID](os.urandom(8), os.urandom(8), 0, (c.SP4_NONE, None), [])
        st, res = client.compound([(c.OP_EXCHANGE_ID, args)])
        assert st == 0
        return res[0][2].server_owner_major
    finally:
        client.close()


def open_file(client: RawClient, name: str, *, create: bool):
    """OPEN ``name`` in the export (waiting out a restarted head's grace period): (fh, sid)."""
    deadline = time.monotonic() + 30
    while True:
        st, res = client.session(
            [
                (c.OP_PUTFH, client.root_fh()),
                (c.OP_OPEN, open_args(name, b"o", client.clientid, create=create)),
                (c.OP_GETFH, None),
            ]
        )
        if st != c.NFS4ERR_GRACE or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert st == 0, (st, res)
    return res[-1][2], res[2][2].stateid


def write(client: RawClient, fh, sid, offset: int, data: bytes) -> None:
    st, res = client.session(
        [(c.OP_PUTFH, fh), (c.OP_WRITE, t.ARGS[c.OP_WRITE](sid, offset, c.FILE_SYNC4, data))]
    )
    assert st == 0 and res[-1][2].count == len(data), (st, res)


def read(client: RawClient, fh, sid, size: int) -> bytes:
    ops = [(c.OP_PUTFH, fh), (c.OP_READ, t.ARGS[c.OP_READ](sid, 0, size))]
    st, res = client.compound([client.sequence_op(cachethis=False), *ops])
    assert st == 0, (st, res)
    return res[-1][2].data


def refused(config, *args) -> str:
    """What `serve` says (exit 2, no traceback) when it refuses to start."""
    run = shingle("-c", str(config), "serve", "--no-web", *args)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    return run.stderr


def check_refusals(config) -> None:
    assert "--heads 0: at least 1" in refused(config, "--heads", "0")
    text = config.read_text()
    config.write_text(text.replace("[heads]\n", "[heads]\ncount = 2\n", 1))
    try:
        assert "heads.count = 2" in refused(config, "--heads", "2")
    finally:
        config.write_text(text)


def test_two_heads_behind_one_port(appliance_config):
    check_refusals(appliance_config)
    home, port = appliance_config.parent, free_port()
    # the client addresses the test uses reach different heads
    assert {head_for("127.0.0.1", 2), head_for("127.0.0.2", 2)} == {0, 1}
    log = home / "serve.log"
    with log.open("w") as out:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "appliance.cli", "-c", str(appliance_config), "serve"]
            + ["--heads", "2", "--no-web", "--nfs-port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    clients: list[RawClient] = []
    pids: list[int] = []
    try:
        wait_for(lambda: "nfs://" in log.read_text() or daemon.poll() is not None, 90, "serving")
        assert daemon.poll() is None, log.read_text()
        status = heads_status(home)
        pids = [h["pid"] for h in status["heads"]]
        assert [h["serving"] for h in status["heads"]] == [True, True]
        owners = {src: owner_major(port, src) for src in ("127.0.0.1", "127.0.0.2")}
        for src, owner in owners.items():
            assert owner.endswith(f"-head{head_for(src, 2)}".encode())
        # the port mapper's port is the listener's too, and it names the one NFS port
        assert pmap.getport("127.0.0.1", 100003, 3, pmap_port=status["portmap_port"]) == port

        a = RawClient(port, source="127.0.0.1").setup(owner=b"client-a")
        b = RawClient(port, source="127.0.0.2").setup(owner=b"client-b")
        clients += [a, b]
        first = os.urandom(200_000)
        fh, sid = open_file(a, "through-a", create=True)
        write(a, fh, sid, 0, first)
        b_fh, b_sid = open_file(b, "through-a", create=False)
        assert read(b, b_fh, b_sid, len(first)) == first  # the other head reads it
        check_delegation_across_heads(port, a, appliance_config)

        # SIGKILL the head serving a: the listener starts it again under the same index
        index = head_for("127.0.0.1", 2)
        old_pid = status["heads"][index]["pid"]
        os.kill(old_pid, signal.SIGKILL)
        a.close()
        # at once, as a client does: the listener keeps the connection until the head serves
        a = RawClient(port, source="127.0.0.1").setup(owner=b"client-a")
        clients[0] = a
        now = heads_status(home)["heads"][index]
        assert now["serving"] and now["pid"] != old_pid and now["restarts"] == 1
        pids.append(now["pid"])
        fh, sid = open_file(a, "through-a", create=False)
        assert read(a, fh, sid, len(first)) == first  # what it acknowledged survived
        second = os.urandom(100_000)
        write(a, fh, sid, len(first), second)
        assert read(b, b_fh, b_sid, len(first) + len(second)) == first + second

        report = json.loads(shingle("-c", str(appliance_config), "status", "--json").stdout)
        assert [h["index"] for h in report["heads"]["heads"]] == [0, 1]
        assert all(h["alive"] for h in report["heads"]["heads"])
        check = doctor.check_heads(config_mod.load(appliance_config))  # `shingle doctor`'s
        assert check.status == "ok" and "2 serving, 1 restarts" in check.detail, check
    finally:
        for client in clients:
            client.close()
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(120)
        except subprocess.TimeoutExpired:
            daemon.kill()  # its heads stop when their channel to it closes
            daemon.wait()
            raise
    assert daemon.returncode == 0, log.read_text()[-3000:]
    assert "Traceback" not in log.read_text()
    assert " head=1 " in log.read_text()  # each head's lines say which head wrote them
    assert not any(process_alive(pid) for pid in pids)
    assert not (home / "heads.json").exists()


def check_delegation_across_heads(port: int, writer: RawClient, config) -> None:
    """A read delegation held through the other head (its row names that head), recalled by
    it before an OPEN for writing through the writer's head goes through: two processes that
    meet in the catalog only."""
    fh, sid = open_file(writer, "delegated", create=True)
    assert writer.session([(c.OP_PUTFH, fh), (c.OP_CLOSE, t.ARGS[c.OP_CLOSE](0, sid))])[0] == 0
    other = 1 - head_for("127.0.0.1", 2)
    source = next(f"127.0.0.{i}" for i in range(2, 30) if head_for(f"127.0.0.{i}", 2) == other)
    holder = CallbackClient(port, source=source).setup()
    try:
        st, res = holder.open_file("delegated", READ)
        assert st == 0 and res[2][2].delegation[0] == c.OPEN_DELEGATE_READ, (st, res)
        dsid = res[2][2].delegation[1].stateid
        close = (c.OP_CLOSE, t.ARGS[c.OP_CLOSE](0, res[2][2].stateid))
        assert holder.session([(c.OP_PUTFH, fh), close])[0] == 0
        catalog = Catalog(config_mod.load(config).catalog_url)
        try:
            rows = catalog.read(
                lambda conn: conn.execute(
                    select(Setting.__table__.c.value).where(
                        Setting.__table__.c.key.like("nfs_delegation_%")
                    )
                ).scalars()
            )
            assert [json.loads(v)["head"] for v in rows] == [f"head{other}"]
        finally:
            catalog.close()
        opening = open_args("delegated", b"w", writer.clientid, create=False)
        writing = [(c.OP_PUTFH, writer.root_fh()), (c.OP_OPEN, opening)]
        assert writer.session(writing)[0] == c.NFS4ERR_DELAY
        assert [s.other for s in holder.wait_for_recall()] == [dsid.other]
        assert holder.session([(c.OP_PUTFH, fh), (c.OP_DELEGRETURN, dsid)])[0] == 0
        st, res = writer.session(writing)
        assert st == 0, st
        close = (c.OP_CLOSE, t.ARGS[c.OP_CLOSE](0, res[-1][2].stateid))
        assert writer.session([(c.OP_PUTFH, fh), close])[0] == 0
    finally:
        holder.close()


def test_each_head_keeps_and_notifies_its_own_nlm_hosts(sqlite_catalog):
    """NLM hosts to notify after a restart are kept per head (a host's locks are on the head
    its address picks): one head's save does not drop another's hosts, and a restarted head
    notifies its own."""
    sqlite_catalog.set_setting("nsm_monitored", json.dumps({"old": "127.0.0.9"}))  # one head's
    head0 = NsmMonitor(sqlite_catalog, my_name="srv", head=0)
    head1 = NsmMonitor(sqlite_catalog, my_name="srv", head=1)
    head0.monitor("alpha", "127.0.0.3")
    head1.monitor("beta", "127.0.0.4")
    head0.monitor("gamma", "127.0.0.5")  # saved last
    assert NsmMonitor(sqlite_catalog, my_name="srv", head=1).previous == {"beta": "127.0.0.4"}
    again = NsmMonitor(sqlite_catalog, my_name="srv", head=0).previous
    assert again == {"old": "127.0.0.9", "alpha": "127.0.0.3", "gamma": "127.0.0.5"}
