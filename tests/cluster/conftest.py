"""Fixtures of the cluster tests: ``agents(n, drives=1)`` starts ``n`` drive agents (`shingle
agent`), each a host of its own with ``drives`` small zone-file drives under the test's
tmp_path/drives, and stops every one it started when the test ends, also when it fails;
``head_factory(agents)`` makes an ``AgentHead`` over their drives (closed at the end)."""

from __future__ import annotations

import pytest
from agenthelpers import Agent, AgentHead, free_port


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
