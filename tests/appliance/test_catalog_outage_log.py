"""A PostgreSQL outage (a real server stopped with a fast shutdown, as ``pg_ctl stop`` does) is
logged by the catalog's outage log: one line when it starts, a count per interval naming the
threads that met it, one line when it is back; no thread logs a traceback per attempt, and the
daemon carries on once PostgreSQL is back."""

from __future__ import annotations

import logging
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from pgserver import free_port
from test_cli_lifecycle import shingle

from appliance import config as config_mod
from appliance.maintenance import Maintenance
from appliance.runtime import Appliance
from engine.admin import jobs, metrics

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "nfs"))
from nfs4_rawclient import RawClient  # noqa: E402  (tests/nfs: the raw NFSv4.1 client)

from appliance.nfs.v4 import const as c  # noqa: E402


def _init(home: Path, url: str, settings: dict[str, str]) -> config_mod.Config:
    shingle("init", str(home), "--drive-size", "128MiB", "--zone-size", "8MiB", "--catalog", url)
    path = home / "shingle.toml"
    text = path.read_text()
    for key, value in settings.items():
        text, count = re.subn(rf"^#? ?{key} = .*$", f"{key} = {value}", text, count=1, flags=re.M)
        assert count == 1, key
    path.write_text(text)
    return config_mod.load(path)


def test_the_outage_log_tells_start_counts_and_end_in_a_few_lines(caplog):
    from engine.base.ratelog import OutageLog

    outage = OutageLog(logging.getLogger("shingle.test"), "catalog", interval_s=0.3, settle_s=0.2)
    caplog.set_level(logging.INFO, logger="shingle.test")
    outage.recovered()  # nothing to tell while it is up
    assert not caplog.records

    def fail(times: int) -> None:
        for _ in range(times):
            outage.failed("OperationalError: connection refused")
            time.sleep(0.01)

    threads = [threading.Thread(target=fail, args=(40,), name=f"worker-{k}") for k in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outage.down
    outage.recovered()  # a first success while the server starts up ...
    fail(1)  # ... and a refusal: the same outage
    outage.recovered()
    time.sleep(0.25)
    outage.recovered()  # it held: told now
    outage.recovered()  # and once
    assert not outage.down
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("catalog unreachable: OperationalError: connection refused (met by")
    counts = lines[1:-1]
    assert counts, lines
    for line in counts:
        assert re.match(r"catalog unreachable: [1-9]\d* failures in the last 0 s \(worker-", line)
    assert re.fullmatch(
        r"catalog reachable again after [\d.]+ s \(121 failures in all\)", lines[-1]
    )
    # 121 failures in about 0.4 s, at one line per 0.3 s
    assert len(lines) <= 5, lines
    assert not [r for r in caplog.records if r.exc_info]


def test_maintenance_heartbeat_and_change_watch_in_process(pg, tmp_path, caplog):
    """The maintenance loop (scheduled jobs, metric samples, a running job), a job's heartbeat
    and the change watch meet the same outage: its lines come from the catalog alone, counted per
    interval with the threads named; once PostgreSQL is back the job the outage failed is
    recorded as failed (not left running) and the loop records samples again."""
    config = _init(tmp_path / "a", pg.create_database(), {})
    caplog.set_level(logging.INFO)
    samples = {"n": 0}

    def counters():
        samples["n"] += 1
        return {"nfs_ops": samples["n"]}

    with Appliance(config) as appliance:
        catalog = appliance.catalog
        catalog.outage.interval_s = 1.0
        assert catalog.catch_up(10)  # the change watch is listening
        loop = Maintenance(appliance, counters=counters, tick_s=0.05, sample_every_s=0.1)

        def writes_progress_until_it_fails(params, progress, actor):
            while True:
                progress(1, 1, "working")  # done == total: written at every call
                time.sleep(0.05)

        loop.runners["retention"] = writes_progress_until_it_fails
        job = jobs.submit(catalog, "retention", {}, actor="test")
        loop.start()
        heartbeat = jobs.Heartbeat(catalog, 0, every_s=0.05)  # a long job's, beating meanwhile
        try:
            with heartbeat:
                deadline = time.monotonic() + 30
                while jobs.get(catalog, job).state != "running":
                    assert time.monotonic() < deadline, "the job did not start"
                    time.sleep(0.05)
                time.sleep(0.3)
                caplog.clear()
                pg.halt()
                time.sleep(4.0)
                pg.resume()
                deadline = time.monotonic() + 30
                while catalog.outage.down and time.monotonic() < deadline:
                    time.sleep(0.1)
            assert not catalog.outage.down, "the catalog never said it was back"
            deadline = time.monotonic() + 30
            while (state := jobs.get(catalog, job).state) == "running":
                assert time.monotonic() < deadline, "the job the outage failed stays running"
                time.sleep(0.1)
            assert state == "failed", state
            before = metrics.latest(catalog).get("nfs_ops", 0)
            deadline = time.monotonic() + 30
            while metrics.latest(catalog).get("nfs_ops", 0) <= before:
                assert time.monotonic() < deadline, "the loop recorded no sample after the outage"
                time.sleep(0.1)
        finally:
            loop.stop()
            loop.join(30)
    records = [r for r in caplog.records if r.name.startswith("shingle")]
    assert not [r for r in records if r.exc_info], "a traceback was logged"
    lines = [r.getMessage() for r in records]
    starts = [line for line in lines if re.match(r"catalog unreachable: (?!\d+ failures)", line)]
    counts = [line for line in lines if re.match(r"catalog unreachable: \d+ failures", line)]
    back = [line for line in lines if line.startswith("catalog reachable again")]
    assert len(starts) == 1 and len(back) == 1, lines
    # one line a second for a 4 s outage, however many attempts
    assert 2 <= len(counts) <= 6, lines
    named = " ".join(counts)
    for thread in ("maintenance", "heartbeat", "catalog-change-watch"):
        assert thread in named, (thread, counts)
    # and one line for the job the outage failed, without its traceback
    assert [line for line in lines if line.startswith(f"job {job} (retention) failed: ")], lines
    assert len(lines) <= len(counts) + 8, lines


def _wait_port(port: int, proc: subprocess.Popen, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the daemon exited"
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"nothing listens on port {port}")


def _api_status(port: int) -> int:
    """The status of an API call whose bearer token the web UI looks up in the catalog."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/v1/drives", headers={"Authorization": "Bearer nosuchtoken"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _mkdir(raw: RawClient, root: bytes, name: str) -> int:
    from appliance.nfs.v4 import types as t

    create = (c.OP_CREATE, t.ARGS[c.OP_CREATE]((c.NF4DIR, None), name, t.fattr4.cls([], b"")))
    status, _ = raw.session([(c.OP_PUTFH, root), create])
    return status


def test_daemon_logs_a_postgresql_outage_in_a_few_lines_and_serves_after(pg, tmp_path):
    """`shingle serve` with its web UI on PostgreSQL: maintenance ticks every second, alerts and
    metric samples too, NFS clients and web UI requests keep coming while PostgreSQL is stopped
    for 8 s. The log gains a bounded number of lines and no traceback; NFS answers DELAY and the
    web UI 503 meanwhile, and both serve again after."""
    config = _init(
        tmp_path / "a", pg.create_database(), {"metrics_interval_s": "1.0", "interval_s": "1.0"}
    )
    nfs_port, web_port = free_port(), free_port()
    log_path = tmp_path / "serve.log"
    with open(log_path, "w") as out:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "appliance.cli", "-c", str(config.path), "serve"]
            + ["--nfs-port", str(nfs_port), "--web-port", str(web_port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_port(nfs_port, daemon)
        _wait_port(web_port, daemon)
        raw = RawClient(nfs_port).setup()
        root = raw.root_fh()
        assert _mkdir(raw, root, "before") == c.NFS4_OK
        assert _api_status(web_port) == 401
        time.sleep(2.0)  # a few quiet maintenance rounds
        mark = len(log_path.read_text().splitlines())
        pg.halt()
        during_nfs, during_web = set(), set()
        end = time.monotonic() + 8.0
        n = 0
        while time.monotonic() < end:
            n += 1
            during_nfs.add(_mkdir(raw, root, f"during-{n}"))
            during_web.add(_api_status(web_port))
            time.sleep(0.2)
        pg.resume()
        deadline = time.monotonic() + 30
        while _mkdir(raw, root, f"after-{n}") == c.NFS4ERR_DELAY:
            assert time.monotonic() < deadline, "NFS did not come back"
            time.sleep(0.2)
        while _api_status(web_port) != 401:
            assert time.monotonic() < deadline, "the web UI did not come back"
            time.sleep(0.2)
        raw.close()
        while "catalog reachable again" not in log_path.read_text():
            assert time.monotonic() < deadline, "the daemon never said the catalog is back"
            time.sleep(0.2)
        time.sleep(2.0)  # rounds after the outage would log their failures now
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
    assert during_nfs == {c.NFS4ERR_DELAY}, during_nfs
    assert during_web == {503}, during_web
    lines = log_path.read_text().splitlines()[mark:]
    ours = [
        line for line in lines if "logger=shingle" in line and "logger=shingle.daemon" not in line
    ]
    assert not [line for line in lines if 'exc="' in line or "Traceback" in line], "\n".join(
        line[:300] for line in lines
    )
    # the daemon: change watch lost/back, catalog down/back, the catalog alert raised/cleared;
    # each web UI worker that served a request: down/back
    assert len(ours) <= 14, "\n".join(line[:300] for line in ours)
    assert sum("catalog unreachable: " in line for line in ours) >= 1
    assert sum("catalog reachable again" in line for line in ours) >= 1
