"""The metadata server's floating address moves to a live head when its head is killed.

Two heads, each a real `shingle serve` in a host of the test bed over one catalog (SQLite in a
folder both see) and one set of drives ([heads] count 2), both with [cluster] mds_address
(appliance/mds_address.py): they campaign for an etcd lease on the bed's etcd members, and the
holder puts the address on its eth0. Two nfs-rs writers (bedclients.py, nfs_client.py
--reconnect) run as processes of a clients' host and write files through the floating address,
reconnecting to the same address when their connection fails. Head 0 starts first and takes
the address.

Checked:
- head 0 announces its host's address (nfs.host is 0.0.0.0);
- head 0's link cut (alive, but cut off from etcd): it drops the address before head 1 takes
  it (sampled every 20 ms: never on both), and does not take it back once its link is up;
- then, with the writers writing through head 1, head 1 is killed with SIGKILL (nothing of it
  runs any more; its host's kernel keeps the address until the lifetime it gave it lapses):
- the address is on head 0 within the lease TTL plus 4 s of the kill (the time is printed), and
  at no moment on both hosts;
- the clients' host's ARP entry for the address names head 0's MAC right after the move (head
  0's gratuitous ARP: the host is set not to probe a stale entry for 10 minutes meanwhile);
- the writers go on through the address: each acknowledges files begun after the move;
- head 0 (the holder) expires head 1 and takes its client records: head 1's row and its client
  records leave the catalog. A raw NFSv4.1 client that held a lock through the address before
  the kill connects again to the address with the same owner and reclaims its open (CLAIM_
  PREVIOUS) and lock (LOCK with reclaim) in the grace period; once it is over, another
  client's LOCK of the range is denied, naming the reclaimed lock's owner;
- every acknowledged file reads back through the address with its sha256;
- a failed write is never counted: only files whose write returned (nfs-rs's COMMIT answered)
  are acknowledged.

The second test does it over IPv6 on the same bed (the hosts' fdbe:d131::/64 addresses): the
address added with nodad, announced by unsolicited Neighbour Advertisements that the clients'
host must take (it does not probe a stale neighbour entry by itself meanwhile), a kill -9 of
the holder, nothing acknowledged lost. There the two heads are pNFS metadata servers of a third
head, a data server at its IPv6 address that never campaigns: GETDEVICEINFO through the
address names it as tcp6 (RFC 5665), and a WRITE to it over IPv6 is answered FILE_SYNC.

Connections from the test process to bed addresses would meet the sandbox's egress proxy (see
bedclients.py): the clients are processes of the clients' host (the raw client's socket is opened
there), and the test reads the hosts' addresses with ``ip -n``."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from bed import SUBNET, SUBNET6, kill_netns_processes
from bedclients import wait_for
from nfs_client import content

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "nfs"))
from nfs4_rawclient import RawClient, open_args  # noqa: E402  (the raw NFSv4.1 client: reclaims)

from appliance.nfs.v4 import const as c  # noqa: E402
from appliance.nfs.v4 import types as t  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
HEADS = ("mdshead0", "mdshead1")
DATA_SERVER = "mdsds"  # the IPv6 test's pNFS data server, a third head
CLIENT = "mdsclient"
FLOATING = f"{SUBNET}.9"  # below the members' (.11+) and the clients' (.101+) addresses
FLOATING6 = f"{SUBNET6}9"  # the same for IPv6 (the hosts' addresses end in .11+, .101+ likewise)
TTL_S = 4  # [cluster] mds_lease_ttl_s, its minimum
NFS_LEASE_S = 5  # nfs.lease_seconds: head 1 expires head 0 a lease after its last beat
GRACE_S = 5  # the locker's reclaim comes within it (the nfs-rs writers never reclaim)
LOCKER = b"mds-locker"  # the raw client's owner: its lock is reclaimed through head 1
WRITERS = 2
FILE_SIZE = 256 * 1024
BEFORE, AFTER = 2, 2  # files each writer acknowledges before the kill, and begun after the move
PHASE_TIMEOUT_S = 60.0
MOVE_AFTER_TTL_S = 4.0  # what a move may take past the lease TTL (see its assertion)
SAMPLE_S = 0.02


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def configure(text: str, section: str, lines: str) -> str:
    header = f"[{section}]\n"
    assert header in text, f"no [{section}] in the rendered config"
    return text.replace(header, header + lines, 1)


class Serve:
    """`shingle serve` of one head, in its host."""

    def __init__(self, bed, host: str, config: Path):
        self.bed, self.host, self.config = bed, host, config
        self.log = config.parent / "serve.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log, "wb") as log:
            self.proc = self.bed.run(
                self.host,
                [sys.executable, "-m", "appliance.cli", "-c", str(self.config), "serve",
                 "--no-web"],
                env=env(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        while "nfs://" not in self.text():
            assert self.proc.poll() is None, f"{self.host} exited: {self.text()[-3000:]}"
            assert time.monotonic() < deadline, f"{self.host} not up: {self.text()[-3000:]}"
            time.sleep(0.2)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        kill_netns_processes(self.bed.hosts[self.host].netns)


def with_prefix(address: str) -> str:
    return f"{address}/64" if ":" in address else f"{address}/24"


def address_line(bed, host: str, address: str) -> str | None:
    """``ip -o addr``'s line of ``address`` on the host's eth0 (None: not there)."""
    family = "-6" if ":" in address else "-4"
    listed = subprocess.run(
        ["ip", "-n", bed.hosts[host].netns, "-o", family, "addr", "show", "dev", "eth0"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    found = [line for line in listed.stdout.splitlines() if f" {with_prefix(address)} " in line]
    return found[0] if found else None


def holds(bed, host: str, address: str = FLOATING) -> bool:
    return address_line(bed, host, address) is not None


def status_of(bed, head: Serve) -> dict:
    """`shingle status --json`'s floating address report, run in the head's host."""
    done = bed.run(
        head.host, [sys.executable, "-m", "appliance.cli", "-c", str(head.config), "status",
                    "--json"],
        env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    out, err = done.communicate(timeout=60)
    assert done.returncode == 0, err
    return json.loads(out)["mds_address"]


def watch_move(bed, source: str, target: str, address: str = FLOATING) -> tuple[float, float]:
    """Sample both hosts' addresses every SAMPLE_S until ``target`` holds the address, failing
    if both ever do: (when ``source`` was first seen without it, when ``target`` with it)."""
    started = time.monotonic()
    lapsed = moved = None
    while moved is None:
        on_source, on_target = holds(bed, source, address), holds(bed, target, address)
        now = time.monotonic()
        assert not (on_source and on_target), "the address is on both heads"
        if lapsed is None and not on_source:
            lapsed = now
        if on_target:
            moved = now
        assert now - started < PHASE_TIMEOUT_S, f"the address did not move to {target}"
        time.sleep(SAMPLE_S)
    assert lapsed is not None
    return lapsed, moved


def catalog_rows(catalog: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(f"file:{catalog}?mode=ro", uri=True, timeout=10) as conn:
        return conn.execute(sql).fetchall()


def raw_client(
    bed, owner: bytes | None, *, reclaim_complete: bool = True, address: str = FLOATING
) -> RawClient:
    """A raw NFSv4.1 client of the floating address with a session; its socket is opened in
    the clients' host and used from the test's thread."""

    def made() -> RawClient:
        raw = RawClient(2049, host=address)
        raw.sock.settimeout(20)
        raw.setup(owner=owner, reclaim_complete=reclaim_complete)
        return raw

    return bed.call(CLIENT, made)


def lock(raw: RawClient, fh: bytes, open_sid, owner: bytes, *, reclaim: bool = False):
    """(status, results) of a write LOCK of bytes 0-9 by a new lock owner under ``open_sid``."""
    locker = (
        True,
        t.open_to_lock_owner4.cls(0, open_sid, 0, t.state_owner4.cls(raw.clientid, owner)),
    )
    args = t.ARGS[c.OP_LOCK](c.WRITE_LT, reclaim, 0, 10, locker)
    return raw.session([(c.OP_PUTFH, fh), (c.OP_LOCK, args)])


def open_existing(raw: RawClient, name: str):
    """(status, open stateid) of an OPEN of ``name`` in the export root."""
    args = open_args(name, b"ob", raw.clientid, create=False)
    status, res = raw.session([(c.OP_PUTFH, raw.root_fh()), (c.OP_OPEN, args)])
    return status, (res[-1][2].stateid if status == c.NFS4_OK else None)


def reclaim_lock(bed, fh: bytes) -> RawClient:
    """The locker back after its server moved: OPEN CLAIM_PREVIOUS and LOCK with reclaim
    through the address (a new client id of the same owner, as a rebooted client), then
    RECLAIM_COMPLETE."""
    again = raw_client(bed, LOCKER, reclaim_complete=False)
    reclaim = open_args("locked", b"oa", again.clientid, create=False)
    reclaim.claim = (c.CLAIM_PREVIOUS, c.OPEN_DELEGATE_NONE)
    status, res = again.session([(c.OP_PUTFH, fh), (c.OP_OPEN, reclaim)])
    assert status == c.NFS4_OK, f"OPEN CLAIM_PREVIOUS through the new holder: {status}"
    status, _ = lock(again, fh, res[-1][2].stateid, b"la", reclaim=True)
    assert status == c.NFS4_OK, f"LOCK reclaim through the new holder: {status}"
    assert again.session([(c.OP_RECLAIM_COMPLETE, False)])[0] == c.NFS4_OK
    return again


def make_heads(
    bed, folder: Path, address: str = FLOATING, *, data_server: str | None = None
) -> tuple[Path, list[Serve]]:
    """Head 0's folder made by `shingle init` (catalog, drives), head 1's naming its catalog;
    both campaign for the floating ``address`` (IPv4 or IPv6). ``data_server``: a third head
    in that host, a pNFS data server at its IPv6 address, and heads 0 and 1 pNFS metadata
    servers naming it (the third head is given the address too, and so never campaigns)."""
    first = folder / "head0"
    # 256 MiB drives: the heads' hot bands outlast the paced writers (64 MiB ran out once)
    init = subprocess.run(
        [sys.executable, "-m", "appliance.cli", "init", str(first), "--drive-size", "256MiB",
         "--zone-size", "4MiB", "--no-preallocate", "--nfs-port", "2049"],
        env=env(), capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert init.returncode == 0, init.stderr
    catalog = (first / "catalog.db").resolve()
    endpoints = ",".join(bed.etcd_endpoints)
    wildcard = "::" if ":" in address else "0.0.0.0"
    nfs = (
        f'host = "{wildcard}"\nlease_seconds = {NFS_LEASE_S}\ngrace_seconds = {GRACE_S}\n'
        'portmap = "off"\n'
    )

    def cluster(host: str) -> str:
        return (
            f'etcd_endpoints = "{endpoints}"\nname = "{host}"\n'
            f'mds_address = "{with_prefix(address)}"\n'
            f'mds_interface = "eth0"\nmds_lease_ttl_s = {TTL_S}\n'
        )

    count = 3 if data_server else 2
    pnfs = ""
    if data_server:
        pnfs = f'role = "mds"\ndata_servers = "[{bed.hosts[data_server].address6}]:2049"\n'
    config = first / "shingle.toml"
    text = config.read_text()
    text = configure(text, "nfs", nfs)
    text = configure(text, "heads", f"count = {count}\nindex = 0\n")
    text = configure(text, "cluster", cluster(HEADS[0]))
    text = configure(text, "pnfs", pnfs)
    config.write_text(text)
    heads = [Serve(bed, HEADS[0], config)]
    others = [(HEADS[1], pnfs)]
    if data_server:
        others.append(
            (data_server, f'role = "ds"\naddress = "[{bed.hosts[data_server].address6}]:2049"\n')
        )
    for index, (host, role) in enumerate(others, start=1):
        made = folder / f"head{index}"
        made.mkdir()
        (made / "shingle.toml").write_text(
            f'[catalog]\nurl = "sqlite:///{catalog}"\n\n[nfs]\nport = 2049\n{nfs}\n'
            f"[heads]\ncount = {count}\nindex = {index}\n\n[cluster]\n{cluster(host)}\n"
            f"[pnfs]\n{role}"
        )
        heads.append(Serve(bed, host, made / "shingle.toml"))
    return catalog, heads


def wait(ready, what: str, writers: list | None = None) -> float:
    return wait_for(ready, what, writers or [], PHASE_TIMEOUT_S)


def test_the_metadata_server_address_moves_to_a_live_head_when_its_head_is_killed(
    healed_bed, nfs_clients, tmp_path
):
    bed = healed_bed
    for host in HEADS:
        if host not in bed.hosts:
            bed.add_host(host)
    clients = nfs_clients(CLIENT)
    catalog, heads = make_heads(bed, tmp_path)
    stop = tmp_path / "stop-writing"
    raws: list[RawClient] = []
    figures: dict[str, float] = {}
    # the clients' host keeps using an ARP entry NO_PROBE_S before probing it: after the kill
    # it reaches head 0 only because head 0's gratuitous ARP replaced head 1's MAC there
    delay_before = probe_delay(bed, CLIENT, "ipv4", NO_PROBE_S)
    try:
        heads[0].start()
        # nfs.host is 0.0.0.0: serve announces the host's own address, not the wildcard
        announced = heads[0].text()
        assert f"nfs://{bed.hosts[HEADS[0]].address}:2049/" in announced, announced[-2000:]
        assert "0.0.0.0:/export" not in announced and "nfs://0.0.0.0" not in announced
        wait(lambda: holds(bed, HEADS[0]), "head 0 takes the address")
        heads[1].start()
        assert not holds(bed, HEADS[1])

        # a holder cut off from etcd (alive, its link down) drops the address before the
        # lease can pass: head 1 takes it, and head 0 does not take it back once its link is up
        cut = time.monotonic()
        bed.cut_link(HEADS[0])
        try:
            dropped, taken = watch_move(bed, HEADS[0], HEADS[1])
        finally:
            bed.restore_link(HEADS[0])
        assert dropped < taken
        figures["cut_holder_dropped_s"] = dropped - cut
        figures["cut_then_moved_s"] = taken - cut
        # logged when office ends by head 0's clock, which is before etcd's: a loaded host's
        # guard thread may still be on its way
        wait(lambda: "no longer serves" in heads[0].text(), "head 0 saying it gave the address up")
        time.sleep(1.0)
        assert holds(bed, HEADS[1]) and not holds(bed, HEADS[0])
        writers = clients.writers(FLOATING, WRITERS, FILE_SIZE, stop, reconnect=True)
        wait(lambda: all(len(w.acked()) >= BEFORE for w in writers), "writes before", writers)
        locker = raw_client(bed, LOCKER)
        raws.append(locker)
        fh, opened = locker.open_new("locked", b"oa")
        assert lock(locker, fh, opened, b"la")[0] == c.NFS4_OK
        held = (
            f"SELECT held_state FROM nfs_clients WHERE head = 'head1' AND owner = x'{LOCKER.hex()}'"
        )
        wait(lambda: catalog_rows(catalog, held) == [(1,)], "the locker's record holds state")

        assert heads[1].proc is not None
        killed = time.monotonic()
        heads[1].proc.kill()  # SIGKILL: the holder gets no chance to give the address up
        heads[1].proc.wait()
        lapsed, moved = watch_move(bed, HEADS[1], HEADS[0])
        figures["address_lapsed_on_dead_head_s"] = lapsed - killed
        figures["address_moved_s"] = moved - killed
        # the lease TTL, then etcd's revoke, head 0's watch and campaign and its `ip` command:
        # ~4 s quiet, 6.1 s seen at a load of 30
        assert moved - killed <= TTL_S + MOVE_AFTER_TTL_S, figures
        new_mac = mac_of(bed, HEADS[0])
        wait(
            lambda: neighbour_mac(bed, CLIENT, FLOATING) == new_mac,
            "the clients' ARP entry names head 0", writers,
        )  # fmt: skip
        figures["client_arp_moved_s"] = time.monotonic() - killed

        wait(
            lambda: not catalog_rows(catalog, "SELECT 1 FROM nfs_heads WHERE name = 'head1'"),
            "head 0 expires head 1", writers,
        )  # fmt: skip
        figures["dead_head_expired_by_s"] = time.monotonic() - killed
        assert not catalog_rows(catalog, "SELECT 1 FROM nfs_clients WHERE head = 'head1'")
        assert "silent for" in heads[0].text(), heads[0].text()[-3000:]
        # the locker's record is head 1's now: it reclaims its open and lock through the address
        assert catalog_rows(catalog, held.replace("'head1'", "'head0'")) == [(1,)], catalog_rows(
            catalog, "SELECT head, hex(owner), held_state, confirmed FROM nfs_clients"
        )
        reclaimer = reclaim_lock(bed, fh)
        raws.append(reclaimer)
        figures["reclaimed_by_s"] = time.monotonic() - killed
        # once the grace period is over, the reclaimed lock holds against another client
        other = raw_client(bed, None)
        raws.append(other)
        while (opened := open_existing(other, "locked"))[0] == c.NFS4ERR_GRACE:
            assert time.monotonic() - killed < PHASE_TIMEOUT_S, "the grace period never ended"
            # the reclaimer renews its lease (SEQUENCE), else its lock would yield to a
            # conflict once the lease ran out (a courtesy lock)
            assert reclaimer.session([])[0] == c.NFS4_OK
            time.sleep(0.2)
        assert opened[0] == c.NFS4_OK, opened[0]
        status, res = lock(other, fh, opened[1], b"lb")
        assert status == c.NFS4ERR_DENIED, status
        assert res[-1][2].owner.owner == b"la"

        try:
            wait(
                lambda: all(
                    sum(1 for a in w.acked() if a["began"] > moved) >= AFTER for w in writers
                ),
                "writes after the move", writers,
            )  # fmt: skip
        except AssertionError as exc:
            lines = [
                {k: (round(v - killed, 2) if k in ("began", "done", "reconnected", "at") else v)
                 for k, v in line.items()}
                for w in writers for line in w.lines[-8:]
            ]  # fmt: skip
            raise AssertionError(
                f"{exc}; {figures}\nthe writers' last lines (s after the kill): {lines}"
            ) from None
        # (not earlier: a `shingle status` process takes seconds at load, and the locker must
        # reclaim within the grace period that head 0's takeover of head 1 starts)
        assert status_of(bed, heads[0]) == {
            "address": f"{FLOATING}/24", "holder": HEADS[0], "etcd_error": None,
        }  # fmt: skip
        first_after = min(a["done"] for w in writers for a in w.acked() if a["began"] > killed)
        figures["first_ack_after_kill_s"] = first_after - killed
        stop.touch()
        for writer in writers:
            writer.finish()
        acked = {a["name"]: a["sha256"] for w in writers for a in w.acked()}
        assert all(
            sha == hashlib.sha256(content(name, FILE_SIZE)).hexdigest()
            for name, sha in acked.items()
        )
        wrong = clients.read_back(FLOATING, acked)
        assert not wrong, f"read back wrong or failed through the address: {wrong}"
        failed = sorted({line["error"] for w in writers for line in w.lines if "error" in line})
        recovered = [line for w in writers for line in w.lines if "recovery" in line]
        reconnects = sum(1 for w in writers for line in w.lines if "reconnected" in line)
        rounded = {k: round(v, 2) for k, v in figures.items()}
        after_kill = sorted(
            (
                round(line.get("done", line.get("reconnected", 0)) - killed, 2),
                line.get("error", "reconnected"),
            )
            for w in writers
            for line in w.lines
            if ("error" in line or "reconnected" in line)
        )
        print(f"\nafter the kill: {after_kill}")
        print(
            f"\n{len(acked)} files acknowledged and read back (sha256) through {FLOATING}; "
            f"writes that failed and were not counted: {failed}; {reconnects} reconnects by "
            f"the script, {len(recovered)} nfs-rs recoveries; lease TTL {TTL_S} s: {rounded}"
        )
    except (AssertionError, OSError) as exc:  # (a raw client's connection closed is an OSError)
        tails = "\n".join(f"--- {head.host}\n{head.text()[-3000:]}" for head in heads)
        raise AssertionError(f"{exc}\n{tails}") from exc
    finally:
        stop.touch()
        for raw in raws:
            raw.close()
        for head in heads:
            head.stop()
        probe_delay(bed, CLIENT, "ipv4", delay_before)
        for host in HEADS:
            subprocess.run(
                ["ip", "-n", bed.hosts[host].netns, "addr", "del", f"{FLOATING}/24", "dev",
                 "eth0"], capture_output=True, check=False,
            )  # fmt: skip


NEIGH_PROBE_DELAY = "/proc/sys/net/{family}/neigh/eth0/delay_first_probe_time"
NO_PROBE_S = 600  # the clients' host: a stale neighbour entry is not probed again this long


def mac_of(bed, host: str) -> str:
    listed = subprocess.run(
        ["ip", "-n", bed.hosts[host].netns, "-o", "link", "show", "dev", "eth0"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    words = listed.stdout.split()
    return words[words.index("link/ether") + 1]


def neighbour_mac(bed, host: str, address: str) -> str | None:
    """The link-layer address ``host``'s neighbour entry gives ``address`` (None: no entry)."""
    listed = subprocess.run(
        ["ip", "-n", bed.hosts[host].netns, "neigh", "show", address, "dev", "eth0"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    words = listed.stdout.split()
    return words[words.index("lladdr") + 1] if "lladdr" in words else None


def probe_delay(bed, host: str, family: str, seconds: int | None = None) -> int:
    """The host's delay before a stale neighbour entry in use is probed (``family`` ipv4: ARP,
    ipv6: neighbour discovery), set when ``seconds`` is given; the value before."""

    def swap() -> int:
        # /proc/sys/net is the opening thread's namespace's: the host's, not the machine's
        with open(NEIGH_PROBE_DELAY.format(family=family), "r+") as f:
            before = int(f.read())
            if seconds is not None:
                f.seek(0)
                f.write(str(seconds))
        return before

    return bed.call(host, swap)


def pnfs_over_ipv6(bed, raws: list[RawClient]) -> None:
    """Through the IPv6 floating address (the new holder, a pNFS metadata server): LAYOUTGET,
    then GETDEVICEINFO names the data server by its IPv6 universal address (RFC 5665: netid
    tcp6, the address's text then .p1.p2 of port 2049); a WRITE sent to the data server at that
    address under the metadata server's open stateid is answered FILE_SYNC and reads back
    through the floating address."""
    mds = raw_client(bed, None, address=FLOATING6)
    raws.append(mds)
    fh, open_sid = mds.open_new("through-the-ds", b"od")
    args = t.ARGS[c.OP_LAYOUTGET](
        False, c.LAYOUT4_NFSV4_1_FILES, c.LAYOUTIOMODE4_RW, 0, (1 << 64) - 1, 0, open_sid, 4096
    )
    status, res = mds.session([(c.OP_PUTFH, fh), (c.OP_LAYOUTGET, args)])
    assert status == c.NFS4_OK, status
    (layout,) = res[-1][2].layout
    _kind, body = layout.content
    files = t.nfsv4_1_file_layout4.decode(body)
    args = t.ARGS[c.OP_GETDEVICEINFO](bytes(files.deviceid), c.LAYOUT4_NFSV4_1_FILES, 4096, [])
    status, res = mds.session([(c.OP_GETDEVICEINFO, args)])
    assert status == c.NFS4_OK, status
    _kind, body = res[-1][2].device_addr
    device = t.nfsv4_1_file_layout_ds_addr4.decode(body)
    ds = bed.hosts[DATA_SERVER].address6
    assert [[(a.netid, a.addr) for a in path] for path in device.multipath_ds_list] == [
        [("tcp6", f"{ds}.8.1")]
    ]

    def connected() -> RawClient:
        raw = RawClient(2049, host=ds)
        raw.sock.settimeout(20)
        return raw.setup()

    data_server = bed.call(CLIENT, connected)
    raws.append(data_server)
    data = os.urandom(64 * 1024)
    write = t.ARGS[c.OP_WRITE](open_sid, 0, c.UNSTABLE4, data)
    status, res = data_server.session([(c.OP_PUTFH, fh), (c.OP_WRITE, write)])
    assert status == c.NFS4_OK, status
    assert res[-1][2].committed == c.FILE_SYNC4
    read = t.ARGS[c.OP_READ](open_sid, 0, len(data))
    status, res = mds.session([(c.OP_PUTFH, fh), (c.OP_READ, read)])
    assert status == c.NFS4_OK and bytes(res[-1][2].data) == data, status


def test_an_ipv6_metadata_server_address_moves_when_its_head_is_killed(
    healed_bed, nfs_clients, tmp_path
):
    """The same over IPv6 (fdbe:d131::9/64, nfs.host "::"): the holder adds the address with
    nodad (usable at once, never tentative) and announces it by unsolicited Neighbour
    Advertisements. The clients' host is made to keep a neighbour entry it uses for
    NO_PROBE_S before probing it (it would otherwise find the new holder by itself, after
    neighbour unreachability detection's 5 + 3 s): so once head 0 is killed, the writers
    reach head 1 only because its advertisement replaced head 0's MAC in their entry. Nothing
    acknowledged is lost."""
    bed = healed_bed
    for host in (*HEADS, DATA_SERVER):
        if host not in bed.hosts:
            bed.add_host(host)
    clients = nfs_clients(CLIENT)
    catalog, heads = make_heads(bed, tmp_path, FLOATING6, data_server=DATA_SERVER)
    stop = tmp_path / "stop-writing"
    figures: dict[str, float] = {}
    raws: list[RawClient] = []
    delay_before = probe_delay(bed, CLIENT, "ipv6", NO_PROBE_S)
    try:
        heads[0].start()
        announced = heads[0].text()
        # nfs.host "::" (IPv4 too, as mapped addresses): the host's addresses of both families
        # announced, not the wildcard
        assert f"nfs://{bed.hosts[HEADS[0]].address}:2049/" in announced, announced[-2000:]
        assert bed.hosts[HEADS[0]].address6 in announced and "nfs://[::]" not in announced
        wait(lambda: holds(bed, HEADS[0], FLOATING6), "head 0 takes the IPv6 address")
        line = address_line(bed, HEADS[0], FLOATING6) or ""
        assert "nodad" in line and "tentative" not in line, line
        heads[1].start()
        heads[2].start()
        assert not holds(bed, HEADS[1], FLOATING6)
        writers = clients.writers(FLOATING6, WRITERS, FILE_SIZE, stop, reconnect=True)
        wait(lambda: all(len(w.acked()) >= BEFORE for w in writers), "writes before", writers)
        assert neighbour_mac(bed, CLIENT, FLOATING6) == mac_of(bed, HEADS[0])

        assert heads[0].proc is not None
        killed = time.monotonic()
        heads[0].proc.kill()  # SIGKILL: the holder gets no chance to give the address up
        heads[0].proc.wait()
        lapsed, moved = watch_move(bed, HEADS[0], HEADS[1], FLOATING6)
        figures["address_lapsed_on_dead_head_s"] = lapsed - killed
        figures["address_moved_s"] = moved - killed
        assert moved - killed <= TTL_S + MOVE_AFTER_TTL_S, figures
        line = address_line(bed, HEADS[1], FLOATING6) or ""
        assert "nodad" in line and "tentative" not in line, line
        assert not holds(bed, DATA_SERVER, FLOATING6)  # a data server never campaigns
        # the advertisement goes out as the address comes up, and again 1.1 s later
        new_mac = mac_of(bed, HEADS[1])
        wait(
            lambda: neighbour_mac(bed, CLIENT, FLOATING6) == new_mac,
            "the clients' neighbour entry names head 1", writers,
        )  # fmt: skip
        figures["client_neighbour_moved_s"] = time.monotonic() - killed
        wait(
            lambda: all(
                sum(1 for a in w.acked() if a["began"] > moved) >= AFTER for w in writers
            ),
            "writes after the move", writers,
        )  # fmt: skip
        first_after = min(a["done"] for w in writers for a in w.acked() if a["began"] > killed)
        figures["first_ack_after_kill_s"] = first_after - killed
        stop.touch()
        for writer in writers:
            writer.finish()
        acked = {a["name"]: a["sha256"] for w in writers for a in w.acked()}
        wrong = clients.read_back(FLOATING6, acked)
        assert not wrong, f"read back wrong or failed through the address: {wrong}"
        # head 1 expires head 0 (a lease of silence after the kill: the writers' new files may
        # be acknowledged before), whose clients followed the address; the data server leaves
        # head 0 to the holder
        try:
            wait(
                lambda: not catalog_rows(catalog, "SELECT 1 FROM nfs_heads WHERE name = 'head0'"),
                "head 1 expires head 0",
            )  # fmt: skip
        except AssertionError as exc:
            heads_now = catalog_rows(
                catalog, "SELECT name, instance, beat, need_grace, enforcing FROM nfs_heads"
            )
            raise AssertionError(f"{exc}: {heads_now} at {time.time_ns()}") from None
        assert "silent for" in heads[1].text() and "silent for" not in heads[2].text()
        pnfs_over_ipv6(bed, raws)
        rounded = {k: round(v, 2) for k, v in figures.items()}
        print(
            f"\n{len(acked)} files acknowledged and read back (sha256) through [{FLOATING6}]; "
            f"lease TTL {TTL_S} s: {rounded}"
        )
    except (AssertionError, OSError) as exc:
        tails = "\n".join(f"--- {head.host}\n{head.text()[-3000:]}" for head in heads)
        raise AssertionError(f"{exc}\n{tails}") from exc
    finally:
        stop.touch()
        for raw in raws:
            raw.close()
        for head in heads:
            head.stop()
        probe_delay(bed, CLIENT, "ipv6", delay_before)
        for host in HEADS:
            subprocess.run(
                ["ip", "-n", bed.hosts[host].netns, "addr", "del", with_prefix(FLOATING6),
                 "dev", "eth0"], capture_output=True, check=False,
            )  # fmt: skip
