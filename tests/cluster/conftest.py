"""Fixtures of the cluster tests.

- ``agents(n, drives=1)`` starts ``n`` drive agents (`shingle agent`), each a host of its own
  with ``drives`` small zone-file drives under the test's tmp_path/drives, and stops every one
  it started when the test ends, also when it fails; ``head_factory(agents)`` makes an
  ``AgentHead`` over their drives (closed at the end).
- ``bed``: the cluster test bed (bed.py: three etcd members and three PostgreSQL members under
  Patroni, each in a network namespace of its own), started once for every test of the session
  that asks for it (about 15 s) and removed at the end of the session, also after failures. A
  test that kills hosts or cuts links takes ``healed_bed``, which calls ``bed.heal()`` when it
  ends, so the next finds the cluster whole. Skipped, with the reason, only where network
  namespaces cannot be made (not root, a sandbox without CAP_SYS_ADMIN); a bed that fails to
  start is an error.
- ``nfs_clients(host)``: nfs-rs client processes in a client host of the bed (bedclients.py),
  every one killed when the test ends.
"""

from __future__ import annotations

import pytest
from agenthelpers import Agent, AgentHead, free_port
from bed import Bed, BedUnavailable, check_netns
from bedclients import BedClients


@pytest.fixture
def agents(tmp_path):
    root = tmp_path / "drives"
    root.mkdir(exist_ok=True)
    started: list[Agent] = []
    taken: set[int] = set()

    def start(count: int, drives: int = 1, extra: list[str] | None = None) -> list[Agent]:
        new = [
            Agent(root, f"host{len(started) + i:02d}", free_port(taken), drives, extra or [])
            for i in range(count)
        ]
        started.extend(new)
        for agent in new:
            agent.start()
        for agent in new:
            agent.wait_ready()
        return new

    yield start
    for agent in started:  # all at once: each takes a moment to stop
        agent.terminate()
    for agent in started:
        agent.stop()


@pytest.fixture
def head_factory(sqlite_catalog):
    heads: list[AgentHead] = []

    def make(agent_list: list[Agent], **options) -> AgentHead:
        head = AgentHead(sqlite_catalog, agent_list, **options)
        heads.append(head)
        return head

    yield make
    for head in heads:
        head.close()


@pytest.fixture(scope="session")
def bed():
    try:
        check_netns()
    except BedUnavailable as exc:
        pytest.skip(f"cluster test bed: {exc}")
    with Bed() as started:
        yield started


@pytest.fixture
def healed_bed(bed):
    """The bed, made whole again after the test (killed hosts revived, links restored)."""
    yield bed
    bed.heal()


@pytest.fixture
def nfs_clients(bed):
    made: list[BedClients] = []

    def clients(host: str) -> BedClients:
        made.append(BedClients(bed, host))
        return made[-1]

    yield clients
    for each in made:
        each.close()
