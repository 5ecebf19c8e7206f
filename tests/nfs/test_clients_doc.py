"""docs/clients.md's fsspec examples (runs=host), run as written against the NFS server over
127.0.0.1; its mount examples (runs=vm) run in the kernel rig (tests/kernel)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from doc_blocks import doc_blocks

HOST_BLOCKS = [b for b in doc_blocks() if b.where == "host"]


def test_every_example_is_run_somewhere():
    blocks = doc_blocks()  # raises on a code block without its marker
    assert {b.where for b in blocks} == {"vm", "host"}
    assert [b.name for b in HOST_BLOCKS] == [
        "fsspec-basics",
        "fsspec-zarr",
        "fsspec-dataloader",
        "fsspec-big-reads",
        "fsspec-safetensors",
    ]


@pytest.mark.parametrize("block", HOST_BLOCKS, ids=[b.name for b in HOST_BLOCKS])
def test_fsspec_example_runs(server, tmp_path, block):
    # a script file, not -c: forkserver workers import the example's classes from it
    script = tmp_path / f"{block.name}.py"
    script.write_text(block.for_server("127.0.0.1", server.port))
    run = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, f"{block.name}:\n{run.stdout[-2000:]}\n{run.stderr[-3000:]}"
    assert run.stdout.strip(), f"{block.name} printed nothing"
