"""The drive lifecycle as an admin runs it against `shingle serve`: fail a drive, see the
rebuild end with warnings (too few drives), add a drive the daemon picks up, reach full
redundancy with every byte checked; the alerts raised and cleared on the way."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import time

import clirunner
from pgserver import free_port

from appliance import config as config_mod
from appliance.runtime import Appliance
from engine.lifecycle.scrub import Scrubber
from engine.namespace import ROOT


def shingle(*args, check=True, timeout=180):
    run = clirunner.run(list(args), timeout=timeout)
    if check:
        assert run.returncode == 0, run.stderr
    return run


def test_fail_add_rebuild_through_the_daemon(tmp_path):
    home = tmp_path / "appliance"
    shingle(
        "init",
        str(home),
        "--drives",
        "10",
        "--drive-size",
        "48MiB",
        "--zone-size",
        "4MiB",
        "--no-preallocate",
    )
    conf = home / "shingle.toml"
    # alerts every second, so the test need not wait
    conf.write_text(conf.read_text().replace("[alerts]\n", "[alerts]\ninterval_s = 1.0\n", 1))
    config = config_mod.load(conf)
    files = {}
    with Appliance(config) as appliance:
        ns = appliance.namespace
        folder = ns.mkdir(ROOT, ns.root_ino, "data")
        for n in range(6):
            data = hashlib.sha256(str(n).encode()).digest() * (40_000 + 9_000 * n)
            made = ns.create(ROOT, folder.ino, f"f{n}")
            ns.write(made.ino, 0, data, stable=True)
            files[f"/data/f{n}"] = hashlib.sha256(data).hexdigest()
    cfg = ["-c", str(conf)]
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
        for line in daemon.stdout:
            if "nfs://" in line:
                break
        shingle(*cfg, "drives", "fail", "1")
        run = shingle(*cfg, "rebuild", "--json", check=False)
        assert run.returncode == 4, run.stderr
        job = json.loads(run.stdout)
        assert job["state"] == "warnings" and "stripes still under-protected" in job["message"]
        assert "only 9 drives take writes" in job["message"]
        status = json.loads(shingle(*cfg, "status", "--json").stdout)
        assert status["redundancy"]["under_protected"] > 0
        assert "redundancy REDUCED" in shingle(*cfg, "status").stdout

        def alerts():
            return json.loads(shingle(*cfg, "alerts", "list", "--json").stdout)

        deadline = time.monotonic() + 30
        while {"drive_failed", "redundancy_reduced"} - {a["kind"] for a in alerts()}:
            assert time.monotonic() < deadline, alerts()
            time.sleep(0.5)
        failed = next(a for a in alerts() if a["kind"] == "drive_failed")
        assert failed["state"] == "active" and "drive 1 is failed" in failed["message"]
        assert "acknowledged" in shingle(*cfg, "alerts", "ack", str(failed["id"])).stdout

        new = tmp_path / "new-drive"
        run = shingle(*cfg, "drives", "add", str(new), "--no-preallocate", "--json")
        job = json.loads(run.stdout)
        assert job["kind"] == "drive-add" and job["state"] == "done", job
        assert job["result"]["warnings"] == [] and job["result"]["status"]["reduced"] == 0
        assert "the daemon" in run.stderr  # the daemon owns the drives and ran the job
        status = json.loads(shingle(*cfg, "status", "--json").stdout)
        assert status["redundancy"]["under_protected"] == 0
        assert any(d["path"] == str(new) and d["state"] == "online" for d in status["drives"])
        deadline = time.monotonic() + 30
        while any(a["state"] != "cleared" for a in alerts() if a["kind"] == "redundancy_reduced"):
            assert time.monotonic() < deadline, alerts()
            time.sleep(0.5)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)
    assert daemon.returncode == 0
    with Appliance(config) as appliance:
        for path, digest in files.items():
            attr = appliance.namespace.resolve(path)
            data = appliance.namespace.read(attr.ino, 0, attr.size)
            assert hashlib.sha256(data).hexdigest() == digest, path
        report = Scrubber(appliance.datapath, appliance.catalog).run()
        assert report.fragments_checked > 0 and report.bad == 0
