"""Lifecycle commands as an admin runs them: in-process without a daemon, as a
daemon job while `shingle serve` owns the drives."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import clirunner
import pytest
from pgserver import free_port

from appliance import config as config_mod
from appliance.runtime import Appliance
from engine.namespace import ROOT


def shingle(*args, check=True, timeout=120):
    run = clirunner.run(list(args), timeout=timeout)
    if check:
        assert run.returncode == 0, run.stderr
    return run


@pytest.fixture
def appliance_dir(tmp_path):
    home = tmp_path / "appliance"
    shingle("init", str(home), "--drive-size", "128MiB", "--zone-size", "8MiB")
    config = config_mod.load(home / "shingle.toml")
    with Appliance(config) as appliance:
        ns = appliance.namespace
        run = ns.mkdir(ROOT, ns.mkdir(ROOT, ns.root_ino, "checkpoints").ino, "run1")
        for step in range(5):
            d = ns.mkdir(ROOT, run.ino, f"step-{step}")
            f = ns.create(ROOT, d.ino, "model.pt")
            ns.write(f.ino, 0, bytes([step]) * 100_000, stable=True)
            ns.setattr(ROOT, d.ino, mtime_ns=(1_700_000_000 + step) * 10**9)
    return home


def test_retention_without_daemon(appliance_dir):
    cfg = ["-c", str(appliance_dir / "shingle.toml")]
    shingle(*cfg, "retention", "add", "/checkpoints/*/step-*", "--keep", "3")
    plan = json.loads(shingle(*cfg, "retention", "preview", "--json").stdout)
    assert [p["path"] for p in plan] == ["/checkpoints/run1/step-0", "/checkpoints/run1/step-1"]
    job = json.loads(shingle(*cfg, "retention", "run", "--json").stdout)
    assert job["state"] == "done" and len(job["result"]) == 2
    assert json.loads(shingle(*cfg, "retention", "preview", "--json").stdout) == []
    assert json.loads(shingle(*cfg, "fsck", "--json").stdout)["clean"]
    bad = shingle(*cfg, "retention", "add", "/checkpoints/../x", "--keep", "3", check=False)
    assert bad.returncode == 1 and ".." in bad.stderr and "Traceback" not in bad.stderr


def test_jobs_go_to_the_daemon_when_it_owns_the_drives(appliance_dir):
    cfg = ["-c", str(appliance_dir / "shingle.toml")]
    shingle(*cfg, "retention", "add", "/checkpoints/*/step-*", "--keep", "2")
    daemon = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "appliance.cli",
            *cfg,
            "serve",
            "--no-web",
            "--nfs-port",
            str(free_port()),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        for line in daemon.stdout:
            if "nfs://" in line or time.monotonic() > deadline:
                break
        second = shingle(*cfg, "serve", "--no-web", "--nfs-port", str(free_port()), check=False)
        assert second.returncode == 2 and "another shingle daemon" in second.stderr
        run = shingle(*cfg, "retention", "run", "--json")
        job = json.loads(run.stdout)
        assert job["state"] == "done" and job["actor"] == "cli" and len(job["result"]) == 3
        assert "the daemon" in run.stderr and "queued job" in run.stderr
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)
    assert daemon.returncode == 0
    listing = json.loads(shingle(*cfg, "jobs", "--json").stdout)
    assert listing[0]["kind"] == "retention" and listing[0]["state"] == "done"
