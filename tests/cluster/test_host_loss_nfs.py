"""A storage host lost under a real NFS client, on the test bed.

Six drive agents, each in a host (network namespace) of its own with one small drive; a head
(catalog on SQLite, DataPath and Namespace of this process, 4+2 stripes: every stripe on all six
hosts) whose NFS server listens on the head host's bed address, every thread of it and of the
data path started inside that host (``Bed.call``). Two nfs-rs writers run as processes of a
third host, the clients' (bedclients.py), so every NFS byte crosses the bed's bridge as it would
between machines. The head is not `shingle serve`: `shingle init` would give it local drives
that placement counts as one more host (test_host_loss.py says the same), and here every
fragment must go to an agent.

Checked, while the writers write 1 MiB files in a loop:
- one storage host's link is cut (the bridge's end of its veth down: no RST, nothing answers):
  every write the clients send completes (none fails), those begun after the cut as stripes of
  five fragments (the write quorum of 4+2), and its drive is missing with an event that names
  its agent (not a folder: an agent's drive has none);
- with the host still cut, every acknowledged file reads back through NFS with its sha256;
- the link back, the drive is taken back online, a rebuild is due (what the maintenance leader
  queues) and writes the fragments the stripes were born without, each on a host the stripe
  did not use yet (one fragment per host again);
- then two other hosts' agents are killed (4+2 loses any two): every acknowledged file still
  reads back through NFS with its sha256, which needs the rebuilt fragments.

The head's agent requests time out after 5 s here (30 s by default): a write meeting the cut
link waits that long once. The lifecycle's shared thread pools are made anew inside the head's
host for this test: a pool another test started in the machine's namespace would open the
rebuild's agent connections from there."""

from __future__ import annotations

import hashlib
import time

from agenthelpers import AgentHead, KiB, MiB
from bedclients import wait_for
from nfs_client import content
from test_agents import hosts_of_stripes
from test_host_loss import BedAgent

from appliance.nfs.server import NfsServerThread
from engine.admin.events import recent
from engine.catalog.models import Export
from engine.lifecycle import drives as drive_states
from engine.lifecycle.hostops import queue_rebuild_after_returns

AGENTS = 6
HEAD, CLIENT = "nlhead", "nlclient"
NFS_PORT = 2049
WRITERS = 2
FILE_SIZE = 1 * MiB  # four 4+2 stripes of 4 x 64 KiB
POLICIES = {
    "hot": {"fragment_size": 64 * KiB},
    "warm": {"k": 4, "m": 2, "fragment_size": 64 * KiB},
    "cold": {"k": 4, "m": 2, "fragment_size": 64 * KiB},
}
REQUEST_LIMIT_S = 5.0
WARM_UP_FILES = 2  # per writer, before the cut
AFTER_CUT_FILES = 3  # per writer, begun after the cut
PHASE_TIMEOUT_S = 90.0


def test_nfs_writes_and_reads_through_a_head_while_a_storage_host_is_cut(
    healed_bed, nfs_clients, sqlite_catalog, monkeypatch, tmp_path
):
    from engine.drives import remote
    from engine.lifecycle import rebuild as rebuilding
    from engine.lifecycle import repair

    monkeypatch.setattr(remote, "REQUEST_TIMEOUT_S", REQUEST_LIMIT_S)
    monkeypatch.setattr(rebuilding, "_STRIPE_POOL", None)  # made anew from the head's host
    monkeypatch.setattr(repair, "_POOL", None)
    bed = healed_bed
    head_address = bed.add_host(HEAD).address
    clients = nfs_clients(CLIENT)
    agents = [BedAgent(bed, f"nlagent{i}") for i in range(AGENTS)]
    for agent in agents:
        bed.add_host(agent.name)
    head: AgentHead | None = None
    server: NfsServerThread | None = None
    stop = tmp_path / "stop-writing"
    timeline: dict[str, float] = {}
    try:
        began = time.monotonic()
        for agent in agents:
            agent.start()
        for agent in agents:
            agent.wait_ready()
        timeline["agents_up_s"] = time.monotonic() - began
        head = bed.call(HEAD, lambda: AgentHead(sqlite_catalog, agents, policies=POLICIES))
        sqlite_catalog.run(
            lambda conn: conn.execute(
                Export.__table__.insert().values(
                    name="/export", path="/", clients="10.131.0.0/24", access="rw",
                    squash="no_root_squash", anon_uid=65534, anon_gid=65534, trash_days=7,
                    enabled=True, sec="sys",
                )
            )
        )  # fmt: skip
        server = bed.call(
            HEAD,
            lambda: NfsServerThread(
                head.ns, sqlite_catalog, host=head_address, port=NFS_PORT
            ).start(),
        )
        writers = clients.writers(head_address, WRITERS, FILE_SIZE, stop)
        timeline["warm_up_s"] = wait_for(
            lambda: all(len(w.acked()) >= WARM_UP_FILES for w in writers),
            "every writer acknowledged at first", writers, PHASE_TIMEOUT_S, errors_allowed=False,
        )  # fmt: skip

        # one host's link cut: writes go on over the five others, as stripes born short
        cut = agents[3]
        cut_drive = next(d for d in head.data.space.drives.values() if d.path == cut.address)
        cut_at = time.monotonic()
        bed.cut_link(cut.name)
        timeline["cut_then_writes_s"] = wait_for(
            lambda: all(
                sum(1 for a in w.acked() if a["began"] > cut_at) >= AFTER_CUT_FILES
                for w in writers
            )
            and cut_drive.state == drive_states.MISSING,
            "writes go on with a host cut", writers, PHASE_TIMEOUT_S, errors_allowed=False,
        )  # fmt: skip
        stop.touch()
        for writer in writers:
            writer.finish()
        assert not [line for w in writers for line in w.errors()]
        acked = {a["name"]: a["sha256"] for w in writers for a in w.acked()}
        assert all(
            sha == hashlib.sha256(content(name, FILE_SIZE)).hexdigest()
            for name, sha in acked.items()
        )
        longest = max(a["done"] - a["began"] for w in writers for a in w.acked())
        short = sqlite_catalog.read(rebuilding.short_work)
        assert short[0] > 0, "no stripe was written while the host was cut"
        assert not {
            stripe for stripe, per_host in hosts_of_stripes(sqlite_catalog).items()
            if max(per_host.values()) > 1
        }, "two fragments of a stripe on one host"  # fmt: skip
        reasons = [
            e.message for e in recent(sqlite_catalog, kind_prefix="drive.state")
            if (e.details or {}).get("drive_id") == cut_drive.id
        ]  # fmt: skip
        assert reasons and not [r for r in reasons if "folder" in r], reasons

        at = time.monotonic()
        wrong = clients.read_back(head_address, acked)
        timeline["read_one_cut_s"] = time.monotonic() - at
        assert not wrong, f"with a host cut: {wrong}"

        # the link back: the drive online again, and the stripes completed
        bed.restore_link(cut.name)
        at = time.monotonic()

        def all_online() -> bool:
            head.data.check_drives()
            return all(d.state == "online" for d in head.data.space.drives.values())

        while not bed.call(HEAD, all_online):
            assert time.monotonic() - at < PHASE_TIMEOUT_S, "the cut host's drive not back"
            time.sleep(0.3)
        timeline["back_online_s"] = time.monotonic() - at
        # what the maintenance leader does next round: a rebuild queued (run here in place)
        assert queue_rebuild_after_returns(sqlite_catalog) is not None
        at = time.monotonic()
        report = bed.call(HEAD, lambda: rebuilding.rebuild(head.data, sqlite_catalog, actor="test"))
        timeline["rebuild_s"] = time.monotonic() - at
        assert (report.stripes, report.fragments_rebuilt) == short[:2], report
        assert report.unplaced == 0 and not report.unrecoverable, report
        assert report.status["reduced"] == 0, report.status
        per_stripe = hosts_of_stripes(sqlite_catalog)
        assert all(sorted(c.values()) == [1] * AGENTS for c in per_stripe.values())

        # any two hosts may go now: two others killed, every acknowledged byte reads back
        for agent in (agents[0], agents[5]):
            agent.kill()
        head.data.reader.drop_cache()
        at = time.monotonic()
        wrong = clients.read_back(head_address, acked)
        timeline["read_two_killed_s"] = time.monotonic() - at
        assert not wrong, f"with two other hosts killed after the rebuild: {wrong}"
        rounded = {k: round(v, 1) for k, v in timeline.items()}
        print(
            f"\n{AGENTS} hosts, {WRITERS} nfs-rs writers of {FILE_SIZE // MiB} MiB files: "
            f"{len(acked)} acknowledged, none failed, longest write {longest:.1f} s; "
            f"{short[0]} stripes born short while a host was cut, {report.fragments_rebuilt} "
            f"fragments rebuilt; {rounded}"
        )
    finally:
        stop.touch()
        if server is not None:
            server.stop()
        if head is not None:
            head.close()
        for agent in agents:
            agent.kill()
        for pool in (rebuilding._STRIPE_POOL, repair._POOL):  # ours, before monkeypatch's undo
            if pool is not None:
                pool.shutdown(wait=False)
