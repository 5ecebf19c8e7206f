"""A daemon killed during a job: the job does not stay "running" for ever, and a CLI waiting for
it does not hang. Real `shingle serve` processes, killed with SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import clirunner
from pgserver import free_port

from appliance import config as config_mod
from appliance.runtime import Appliance
from engine.admin import events, jobs
from engine.catalog import Catalog
from engine.namespace import ROOT


def shingle(*args, timeout=120):
    run = clirunner.run(list(args), timeout=timeout)
    assert run.returncode == 0, run.stderr
    return run


def write_config(home, scrub_mib_s: float) -> None:
    """The config `shingle init` writes, with the scrub paced at ``scrub_mib_s``."""
    (home / "shingle.toml").write_text(
        config_mod.render(
            {"appliance.data_dir": ".", "maintenance.scrub_mib_s": scrub_mib_s},
            commented_defaults=True,
        )
    )


def start_daemon(home) -> subprocess.Popen:
    daemon = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "appliance.cli",
            "-c",
            str(home / "shingle.toml"),
            "serve",
            "--no-web",
            "--nfs-port",
            str(free_port()),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 60
    for line in daemon.stdout:
        if "nfs://" in line:
            return daemon
        assert time.monotonic() < deadline, "the daemon did not start"
    raise AssertionError(f"the daemon exited with {daemon.wait()}")


def wait_until(condition, timeout_s=60.0, what="condition"):
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_kill_9_during_a_scrub_then_restart(tmp_path):
    home = tmp_path / "appliance"
    shingle("init", str(home), "--drive-size", "128MiB", "--zone-size", "8MiB")
    config = config_mod.load(home / "shingle.toml")
    with Appliance(config) as appliance:  # data on the drives for the scrub to read
        ns = appliance.namespace
        for n in range(3):
            f = ns.create(ROOT, ns.root_ino, f"blob-{n}")
            ns.write(f.ino, 0, os.urandom(3 << 20), stable=True)
    write_config(home, scrub_mib_s=0.1)  # slow: the scrub runs for minutes
    catalog = Catalog(config.catalog_url)
    daemon = start_daemon(home)
    waiter = None
    try:
        waiter = subprocess.Popen(
            [sys.executable, "-m", "appliance.cli", "-c", str(home / "shingle.toml"), "scrub"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        job = wait_until(
            lambda: next(
                (j for j in jobs.recent(catalog, 5) if j.kind == "scrub" and j.state == "running"),
                None,
            ),
            what="the scrub job to run",
        )
        time.sleep(1.0)  # well inside the scrub
        daemon.send_signal(signal.SIGKILL)
        daemon.wait(30)
        # The CLI notices that the daemon died, says so and fails, instead of waiting for ever.
        _, err = waiter.communicate(timeout=30)
        assert waiter.returncode == 3, err
        assert f"scrub job {job.id} is running but the daemon (pid {daemon.pid}) has stopped" in err
        assert "queued again when the daemon starts again" in err and "Traceback" not in err
        assert jobs.get(catalog, job.id).state == "running"  # as the dead daemon left it

        write_config(home, scrub_mib_s=1000)
        daemon = start_daemon(home)
        final = jobs.wait(catalog, job.id, timeout_s=120, poll_s=0.2)
        assert final.state == "done" and final.attempts == 2, final
        assert final.result["fragments_checked"] > 0
        requeued = events.recent(catalog, 20, kind_prefix="job.scrub.requeued")
        assert requeued and requeued[0].details["job"] == job.id
    finally:
        if waiter is not None and waiter.poll() is None:
            waiter.kill()
            waiter.wait()
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(60)
        catalog.close()
    assert daemon.returncode == 0
    listing = json.loads(shingle("-c", str(home / "shingle.toml"), "jobs", "--json").stdout)
    assert listing[0]["id"] == job.id and listing[0]["state"] == "done"
