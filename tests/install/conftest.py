"""Helpers for the install tests: the real `shingle` CLI run in a subprocess, a staging root."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import clirunner
import pytest

REPO = Path(__file__).resolve().parents[2]
# Where the units find the launcher inside the staging root (stubbed there:
# verify checks it exists).
LAUNCHER = "/opt/shingle/bin/shingle"


def shingle(*args: str, check: bool = True, env: dict | None = None, timeout: float = 60):
    """Run the real CLI; returns the CompletedProcess (text)."""
    result = clirunner.run(list(args), env={**os.environ, **(env or {})}, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(
            f"shingle {' '.join(args)} exited "
            f"{result.returncode}:\n{result.stdout}\n{result.stderr}"
        )
    return result


def stub_launcher(root: Path) -> Path:
    path = root / LAUNCHER.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


def systemd_analyze() -> str:
    tool = shutil.which("systemd-analyze")
    assert tool, (
        "systemd-analyze missing: apt-get install -y systemd (scripts/bootstrap.sh installs it)"
    )
    return tool


def verify(root: Path, unit: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [systemd_analyze(), "verify", "--man=no", "--recursive-errors=no", f"--root={root}", unit],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def root(tmp_path):
    """A staging root with the launcher stubbed, not yet installed."""
    staging = tmp_path / "root"
    staging.mkdir()
    stub_launcher(staging)
    return staging


@pytest.fixture(scope="module")
def installed_root(tmp_path_factory):
    """One install shared by the read-only checks of a module."""
    staging = tmp_path_factory.mktemp("installed")
    stub_launcher(staging)
    shingle("install", "--root", str(staging), "--bin", LAUNCHER)
    return staging
