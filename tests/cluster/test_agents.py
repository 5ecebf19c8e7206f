"""Drive agents (appliance/agent/) under a head: fragments written and read over the agent
protocol, hosts killed with kill -9, placement over hosts, frames that break the protocol."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict

import pytest
from agenthelpers import SMALL, STRIPE, MiB, free_port

from appliance.status import gather
from engine.base import errors
from engine.catalog.models import Drive, Fragment, Zone
from engine.drives import agentwire as wire
from engine.drives import format_emulated
from engine.drives.remote import RemoteDrive, hello
from engine.lifecycle.hosts import even_spread, hosts_status, losable
from engine.namespace import ROOT

DRIVES, FRAGMENTS = Drive.__table__, Fragment.__table__


def make(head, name: str, data: bytes) -> int:
    ns = head.ns
    ino = ns.create(ROOT, ns.root_ino, name).ino
    ns.write(ino, 0, data)
    ns.commit(ino)
    return ino


def read_all(head, files: dict[str, tuple[int, bytes]]) -> None:
    head.data.reader.drop_cache()
    for name, (ino, data) in files.items():
        assert head.ns.read(ino, 0, len(data) + 1) == data, name


def hosts_of_stripes(catalog) -> dict[int, Counter]:
    """Fragments per host of every stripe."""
    rows = catalog.read(
        lambda conn: conn.execute(
            FRAGMENTS.join(DRIVES, DRIVES.c.id == FRAGMENTS.c.drive_id)
            .select()
            .with_only_columns(FRAGMENTS.c.stripe_id, DRIVES.c.host)
        ).all()
    )
    out: dict[int, Counter] = defaultdict(Counter)
    for stripe_id, host in rows:
        out[stripe_id][host] += 1
    return out


def wait_for(predicate, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def test_writes_through_ten_agents_read_back_after_a_restart_one_fragment_per_host(
    agents, head_factory
):
    hosts = agents(10)
    head = head_factory(hosts)
    assert len(head.drive_ids) == 10
    files = {}
    for i in range(6):
        data = os.urandom(3 * STRIPE + 4099 * i)
        files[f"f{i}"] = (make(head, f"f{i}", data), data)
    read_all(head, files)
    head.restart()  # every fragment from the agents, nothing from a cache
    read_all(head, files)
    layout = hosts_of_stripes(head.catalog)
    assert layout and all(
        len(per_host) == 10 and set(per_host.values()) == {1} for per_host in layout.values()
    ), "each stripe's 10 fragments on 10 different hosts"
    # the bytes are in the agents' zone files, not anywhere the head wrote itself
    for agent in hosts:
        written = sum(f.stat().st_size for f in agent.folders[0].glob("zone-*"))
        assert written > 0, agent.name
    status = gather(head.catalog, head.policies, 2)["hosts"]  # as `shingle status` shows it
    assert status["count"] == 10 and status["losable"] == 2
    assert status["losable_by_placement"] == 2
    assert {h["name"] for h in status["hosts"]} == {a.name for a in hosts}
    assert all(h["fragments"] > 0 and h["drives_readable"] == 1 for h in status["hosts"])


def test_killed_agents_read_as_lost_drives_two_decode_a_third_is_a_clean_eio(agents, head_factory):
    hosts = agents(10)
    head = head_factory(hosts)
    files = {}
    for i in range(4):
        data = os.urandom(2 * STRIPE + 777 * i)
        files[f"f{i}"] = (make(head, f"f{i}", data), data)
    hosts[3].kill()
    read_all(head, files)
    assert head.data.reader.stats["degraded_stripes"] > 0
    hosts[8].kill()  # any two hosts: each stripe has one fragment on each
    read_all(head, files)
    head.data.check_drives()  # the maintenance loop's look: both hosts' drives are missing
    states = head.catalog.read(
        lambda conn: conn.execute(DRIVES.select().with_only_columns(DRIVES.c.state)).scalars().all()
    )
    assert sorted(states).count("missing") == 2
    assert hosts_status(head.catalog, 8, 2)["losable"] == 0
    hosts[5].kill()
    head.data.reader.drop_cache()
    ino, data = files["f0"]
    with pytest.raises(errors.FsError) as failed:
        head.ns.read(ino, 0, len(data))
    assert failed.value.errno == errno.EIO


def test_an_agent_killed_during_writes_fails_or_finishes_each_write_and_reads_decode(
    agents, head_factory
):
    hosts = agents(10)
    head = head_factory(hosts)
    files, failed = {}, 0
    for i in range(12):
        if i == 4:
            hosts[6].kill()
        data = os.urandom(STRIPE + 5000 * i)
        try:
            files[f"f{i}"] = (make(head, f"f{i}", data), data)
        except errors.FsError as exc:  # a stripe in flight when the agent died
            assert exc.errno == errno.EIO
            failed += 1
    assert len(files) >= 10 and failed <= 2
    read_all(head, files)
    head.restart()  # the lost agent's drive is missing from the start: decoded around it
    read_all(head, files)


def test_an_agent_back_after_a_restart_is_taken_back_and_written_again(agents, head_factory):
    hosts = agents(10)
    head = head_factory(hosts)
    files = {"a": (make(head, "a", os.urandom(2 * STRIPE)), b"")}
    files["a"] = (files["a"][0], head.ns.read(files["a"][0], 0, 2 * STRIPE))
    hosts[2].kill()
    head.data.check_drives()
    hosts[2].start().wait_ready()  # same folders: same drive, same write pointers

    def all_online() -> bool:
        head.data.check_drives()
        return all(d.state == "online" for d in head.data.space.drives.values())

    wait_for(all_online)
    data = os.urandom(3 * STRIPE)
    files["b"] = (make(head, "b", data), data)
    layout = hosts_of_stripes(head.catalog)
    assert all(len(per_host) == 10 for per_host in layout.values())
    read_all(head, files)


def test_placement_spreads_over_fewer_hosts_than_fragments_as_evenly_as_possible(
    sqlite_catalog, tmp_path
):
    """Local drives labelled with hosts: 4 hosts of 3, 3, 2 and 2 drives."""
    from engine.coding.erasure import load_policies
    from engine.datapath import DataPath
    from engine.namespace import Namespace

    ids = format_emulated(sqlite_catalog, tmp_path / "drives", 10, 16 * MiB, MiB, preallocate=False)
    names = ["a", "a", "a", "b", "b", "b", "c", "c", "d", "d"]

    def label(conn):
        for drive_id, host in zip(ids, names, strict=True):
            conn.execute(DRIVES.update().where(DRIVES.c.id == drive_id).values(host=host))

    sqlite_catalog.run(label)
    data = DataPath(sqlite_catalog, load_policies(SMALL), reserve_zones=2)
    try:
        ns = Namespace(sqlite_catalog, data=data)
        ino = ns.create(ROOT, ns.root_ino, "f").ino
        ns.write(ino, 0, os.urandom(6 * STRIPE))
        ns.commit(ino)
        layout = hosts_of_stripes(sqlite_catalog)
        assert len(layout) >= 6
        for per_host in layout.values():
            assert sorted(per_host.values()) == [2, 2, 3, 3], per_host
        status = hosts_status(sqlite_catalog, 8, 2)
        assert status["count"] == 4 and status["losable"] == 0  # one host holds 3 > 2 parity
        assert status["losable_by_placement"] == 0
    finally:
        data.close()


def test_losable_hosts_arithmetic():
    assert even_spread([1] * 12, 10) == [1] * 10
    assert sorted(even_spread([2] * 5, 10)) == [2] * 5
    assert sorted(even_spread([3, 3, 2, 2], 10)) == [2, 2, 3, 3]
    assert sorted(even_spread([8, 1, 1], 10)) == [1, 1, 8]
    assert losable([1] * 10, 2) == 2
    assert losable([2] * 5, 2) == 1
    assert losable([3, 3, 2, 2], 2) == 0
    assert losable([1] * 9, 1) == 1  # a stripe already missing a fragment


def shingle(*args, check: bool = True) -> subprocess.CompletedProcess:
    run = subprocess.run(
        [sys.executable, "-m", "appliance.cli", *args], capture_output=True, text=True
    )
    if check:
        assert run.returncode == 0, run.stderr
    return run


def test_drives_attach_records_an_agents_drives_on_its_host_and_status_counts_hosts(
    agents, tmp_path
):
    home = tmp_path / "appliance"
    shingle("init", str(home), "--drive-size", "64MiB", "--zone-size", "4MiB", "--no-preallocate")
    config = str(home / "shingle.toml")
    # zones that hold the default 1 MiB fragments (smaller ones are refused: test_host_ops.py)
    first, second = agents(2, drives=2, extra=["--drive-size", "32MiB", "--zone-size", "4MiB"])
    for agent in (first, second):
        said = shingle("-c", config, "drives-attach", agent.address).stdout
        assert "2 drives of agent" in said
    assert "all known already" in shingle("-c", config, "drives-attach", first.address).stdout
    report = json.loads(shingle("-c", config, "status", "--json").stdout)
    hosts = {d["host"] for d in report["drives"]}
    assert hosts == {None, first.name, second.name} and len(report["drives"]) == 14
    assert report["hosts"]["count"] == 3
    assert "hosts     3; may lose 0 without losing data" in shingle("-c", config, "status").stdout
    # errors a user can act on, never a traceback
    second.kill()
    gone = shingle("-c", config, "drives-attach", second.address, check=False)
    assert gone.returncode == 1 and "unreachable" in gone.stderr and "Traceback" not in gone.stderr
    taken = shingle(
        "agent", "--listen", first.address, "--drives", str(first.folders[0]), check=False
    )
    assert taken.returncode == 2 and f"cannot listen on {first.address}" in taken.stderr
    spare = f"127.0.0.1:{free_port(set())}"
    twice = shingle("agent", "--listen", spare, "--drives", str(first.folders[1]), check=False)
    assert twice.returncode == 2 and "a drive no other agent serves" in twice.stderr
    new = shingle("agent", "--listen", "127.0.0.1:1", "--drives", str(tmp_path / "d"), check=False)
    assert new.returncode == 2 and "holds no drive: make it with --format" in new.stderr


# -- the protocol ---------------------------------------------------------------------------------
def connect(agent) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", agent.port), timeout=10)
    return sock


def test_bad_frames_get_a_clear_error_and_the_agent_keeps_serving(agents):
    (agent,) = agents(1, extra=["--body-timeout", "1"])
    drive = hello(agent.address)["drives"][0]
    key = wire.drive_key(drive["uuid"])

    # a body that does not fit its operation: EPROTO, and the same connection goes on
    with connect(agent) as sock:
        wire.send_frame(sock, wire.READ, 7, b"short")
        reply = wire.read_frame(sock)
        assert (reply.op, reply.request_id, reply.status) == (
            wire.READ | wire.REPLY,
            7,
            errno.EPROTO,
        )
        assert "read body of 5 bytes; expected 32" in json.loads(bytes(reply.body))["message"]
        wire.send_frame(sock, wire.HELLO, 8)
        reply = wire.read_frame(sock)
        assert reply.status == 0 and json.loads(bytes(reply.body))["host"] == agent.name
        # a drive it does not serve, a zone out of range, a read past the write pointer
        wire.send_frame(sock, wire.READ, 9, wire.READ_FIXED.pack(b"\0" * 16, 0, 0, 10))
        reply = wire.read_frame(sock)
        assert reply.status == errno.ENODEV and "serves no drive" in reply.body.decode()
        wire.send_frame(sock, wire.SYNC, 10, wire.DRIVE_ZONE.pack(key, 99999))
        assert wire.read_frame(sock).status == errno.EINVAL
        wire.send_frame(sock, wire.READ, 11, wire.READ_FIXED.pack(key, 0, 0, 4096))
        reply = wire.read_frame(sock)
        assert reply.status == errno.EIO and "passes its write pointer" in reply.body.decode()
        wire.send_frame(sock, wire.READ, 12, wire.READ_FIXED.pack(key, 0, 0, 0xFFFFFFFF))
        assert wire.read_frame(sock).status == errno.EINVAL  # never allocates 4 GiB

    # headers that cannot be trusted: a clear error, then the connection is closed
    cases = {
        b"GET / HTTP/1.1\r\n": "not a shingle agent frame",
        wire.HEADER.pack(wire.MAGIC, 9, wire.HELLO, 0, 1, 0): "protocol version 9",
        wire.header(wire.APPEND, 1, wire.MAX_BODY + 1): "exceeds the limit",
        wire.header(0x33, 1, 0): "unknown operation 51",
    }
    for raw, said in cases.items():
        with connect(agent) as sock:
            sock.sendall(raw)
            reply = wire.read_frame(sock)
            assert reply.status == errno.EPROTO and said in reply.body.decode(), raw
            assert sock.recv(1) == b""  # closed

    # a length that lies: the body never comes; after the time limit, an error and a close
    with connect(agent) as sock:
        sock.sendall(wire.header(wire.APPEND, 5, 100_000) + b"x" * 10)
        reply = wire.read_frame(sock)
        assert reply.status == errno.EPROTO and "did not arrive" in reply.body.decode()

    # still serving, and the drive is intact
    remote = RemoteDrive(agent.address, drive["uuid"], drive["zone_size"], drive["zone_count"])
    try:
        remote.append(0, 0, b"still here", durable=True)
        assert remote.read(0, 0, 10) == b"still here"
    finally:
        remote.close()


def test_remote_drive_refuses_wrong_offsets_and_reconnects_after_the_agent_returns(agents):
    (agent,) = agents(1)
    drive = hello(agent.address)["drives"][0]
    remote = RemoteDrive(agent.address, drive["uuid"], drive["zone_size"], drive["zone_count"])
    try:
        remote.append(1, 0, b"a" * 5000)
        remote.append(1, 5000, b"b" * 3000)
        remote.sync(1)
        assert remote.write_pointer(1) == 8000
        with pytest.raises(OSError, match="its write pointer is 8000"):
            remote.append(1, 4096, b"c", durable=True)
        agent.kill()
        with pytest.raises(OSError) as lost:
            remote.read(1, 0, 10)
        assert lost.value.errno == errno.ENODEV
        wait_for(lambda: not remote.present(), 5)  # its connection's end is seen by a thread
        agent.start().wait_ready()
        wait_for(remote.present, 10)
        assert remote.read(1, 4990, 20) == b"a" * 10 + b"b" * 10
    finally:
        remote.close()


def test_appends_of_many_heads_land_in_one_stream_per_zone(agents):
    """Four connections (as four heads) append to one zone at ANY_OFFSET at once: the agent
    gives each append its own range, the ranges tile the zone from 0 with no gap or overlap,
    and each reads back where the reply said."""
    (agent,) = agents(1)
    drive = hello(agent.address)["drives"][0]
    key = wire.drive_key(drive["uuid"])
    landed: list[tuple[int, int, bytes]] = []
    failures: list[BaseException] = []

    def head(n: int) -> None:
        try:
            with connect(agent) as sock:
                chunks = [os.urandom(1000 + 97 * n + i) for i in range(20)]
                for i, chunk in enumerate(chunks):  # pipelined: all sent before any reply
                    fixed = wire.APPEND_FIXED.pack(key, 2, wire.ANY_OFFSET)
                    wire.send_frame(sock, wire.APPEND, i, fixed, chunk)
                for _ in chunks:
                    reply = wire.read_frame(sock)
                    assert reply.status == 0, reply.body
                    offset, length = wire.APPEND_REPLY.unpack(reply.body)
                    landed.append((offset, length, chunks[reply.request_id]))
        except BaseException as exc:  # noqa: BLE001 - raised in the test's thread below
            failures.append(exc)

    threads = [threading.Thread(target=head, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures[0]
    landed.sort()
    position = 0
    for offset, length, _chunk in landed:
        assert offset == position, "the ranges tile the zone"
        position += length
    remote = RemoteDrive(agent.address, drive["uuid"], drive["zone_size"], drive["zone_count"])
    try:
        assert remote.write_pointer(2) == position
        for offset, length, chunk in landed:
            assert length == len(chunk) and remote.read(2, offset, length) == chunk
    finally:
        remote.close()


def test_bytes_an_agent_holds_past_the_committed_pointer_are_garbage_after_a_restart(
    agents, head_factory
):
    """Durability order: a fragment is durable on its agent before the catalog commits it, so
    a head that dies in between leaves bytes no committed row references. At the next start
    the zone reports (one REPORT per drive) past the catalog's pointer: those bytes become the
    zone's garbage, new fragments go after them, and everything committed reads back."""
    hosts = agents(10)
    head = head_factory(hosts)
    data_a = os.urandom(3 * STRIPE + 123)
    files = {"a": (make(head, "a", data_a), data_a)}
    drive = next(iter(head.data.space.drives.values()))
    zone = next(iter(drive.open.values()))
    idx, end = zone.idx, zone.wp
    head.close()
    # what a head that died after its appends and before its commit leaves on one agent
    remote = RemoteDrive(drive.path, drive.uuid, drive.zone_size, drive.zone_count)
    try:
        remote.append(idx, end, os.urandom(5000), durable=True)
    finally:
        remote.close()
    head.start()
    report = head.data.recovery_report
    assert (report.zones_with_garbage, report.garbage_bytes) == (1, 5000)
    assert report.missing_drives == []
    data_b = os.urandom(2 * STRIPE)
    files["b"] = (make(head, "b", data_b), data_b)
    head.restart()
    read_all(head, files)
    zones = Zone.__table__
    unbalanced = head.catalog.read(
        lambda conn: conn.execute(
            zones.select().where(
                zones.c.write_pointer != zones.c.live_bytes + zones.c.garbage_bytes
            )
        ).all()
    )
    assert not unbalanced, "every zone: write pointer == live + garbage"
    garbage = head.catalog.read(
        lambda conn: conn.execute(
            zones.select()
            .with_only_columns(zones.c.garbage_bytes)
            .where(zones.c.drive_id == drive.id, zones.c.idx == idx)
        ).scalar_one()
    )
    assert garbage >= 5000


def test_the_drive_backends_load_without_the_catalog():
    """engine.drives (and the agent protocol, RemoteDrive) import no catalog module: only the
    functions that write drive rows do, when called."""
    probe = (
        "import sys, engine.drives, engine.drives.remote, engine.drives.agentwire; "
        "print(sorted(m for m in sys.modules if m.startswith('engine.catalog')))"
    )
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "[]"


def test_a_hung_agent_is_cut_off_after_the_time_limit_reads_decode_and_writes_go_on(
    agents, head_factory, monkeypatch
):
    """SIGSTOP: the agent's connections stay up and nothing answers (a hung host, or a link
    that drops everything). The first request past the time limit takes the whole agent as
    lost: reads decode from the other hosts, writes go to the other nine, and once the agent
    answers again its drive is taken back."""
    from engine.drives import remote as remote_mod

    monkeypatch.setattr(remote_mod, "REQUEST_TIMEOUT_S", 3.0)
    hosts = agents(10)
    head = head_factory(hosts)
    data = os.urandom(3 * STRIPE + 99)
    files = {"a": (make(head, "a", data), data)}
    hung = hosts[4]
    assert hung.process is not None
    os.kill(hung.process.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        read_all(head, files)
        assert time.monotonic() - started < 30, "one time limit, not one per fragment"
        head.data.check_drives()
        states = head.catalog.read(
            lambda conn: (
                conn.execute(DRIVES.select().with_only_columns(DRIVES.c.state)).scalars().all()
            )
        )
        assert sorted(states).count("missing") == 1
        data_b = os.urandom(2 * STRIPE)
        files["b"] = (make(head, "b", data_b), data_b)  # on the nine others: degraded stripes
        read_all(head, files)
    finally:
        os.kill(hung.process.pid, signal.SIGCONT)

    def all_online() -> bool:
        head.data.check_drives()
        return all(d.state == "online" for d in head.data.space.drives.values())

    wait_for(all_online, 60)
    read_all(head, files)


def test_rebuild_keeps_fragments_spread_over_hosts(sqlite_catalog, tmp_path):
    """6 hosts of 3 drives: each stripe holds 2, 2, 2, 2, 1 and 1 fragments on them. A failed
    drive's fragments are rebuilt onto hosts holding fewer, never a third onto one host."""
    from engine.coding.erasure import load_policies
    from engine.datapath import DataPath
    from engine.lifecycle import drives as drive_states
    from engine.lifecycle.rebuild import rebuild
    from engine.namespace import Namespace

    ids = format_emulated(sqlite_catalog, tmp_path / "drives", 18, 16 * MiB, MiB, preallocate=False)

    def label(conn):
        for n, drive_id in enumerate(ids):
            conn.execute(DRIVES.update().where(DRIVES.c.id == drive_id).values(host=f"h{n // 3}"))

    sqlite_catalog.run(label)
    data = DataPath(sqlite_catalog, load_policies(SMALL), reserve_zones=2)
    try:
        ns = Namespace(sqlite_catalog, data=data)
        payload = os.urandom(12 * STRIPE)
        ino = ns.create(ROOT, ns.root_ino, "f").ino
        ns.write(ino, 0, payload)
        ns.commit(ino)
        before = hosts_of_stripes(sqlite_catalog)
        assert all(sorted(c.values()) == [1, 1, 2, 2, 2, 2] for c in before.values())
        failed = ids[0]
        drive_states.fail_drive(sqlite_catalog, failed, actor="admin")
        data.refresh_drive_states()
        report = rebuild(data, sqlite_catalog, actor="admin")
        assert report.fragments_rebuilt > 0 and report.unplaced == 0
        after = hosts_of_stripes(sqlite_catalog)
        assert all(max(c.values()) <= 2 for c in after.values()), after
        assert hosts_status(sqlite_catalog, 8, 2)["losable"] == 1  # 2 per host, 2 parity
        data.reader.drop_cache()
        assert ns.read(ino, 0, len(payload)) == payload
    finally:
        data.close()
