"""The code base stays ruff-clean (lint rules and formatting in pyproject.toml) and
type-checks with mypy (files and options in pyproject.toml), so `./run-tests` fails on
either."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_ruff_check_is_clean():
    # no cache: a run must not write .ruff_cache into the checkout (ruff takes ~1 s anyway)
    result = run("ruff", "check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_is_applied():
    result = run("ruff", "format", "--check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_is_clean(tmp_path_factory):
    # the incremental cache lives beside pytest's temp folders (one per checkout), so later
    # runs reuse it (about 40 s cold, a few seconds warm) and nothing is written to the checkout
    checkout = hashlib.sha256(str(ROOT).encode()).hexdigest()[:12]
    cache = tmp_path_factory.getbasetemp().parent / f"mypy-cache-{checkout}"
    result = run("mypy", "--cache-dir", str(cache))
    assert result.returncode == 0, result.stdout + result.stderr
