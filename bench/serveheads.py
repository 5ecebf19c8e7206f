"""`shingle serve` heads as child processes of a benchmark, and the rounds a benchmark runs
its layouts in (bench/pnfs.py, bench/heads_locks.py).

- ``HeadProcesses(homes, ports)``: one `shingle serve --no-web` per folder (its shingle.toml),
  started in order, each waited for until it prints its NFS URL; ``cpu()`` is the CPU seconds
  of them all, ``stop()`` sends SIGTERM and waits (SIGKILL after 60 s);
- ``alternated(layouts, rounds, measure)``: each round runs every layout, odd rounds in the
  reverse order (a machine that slows down over the run hurts both alike); ``medians`` sums
  them up.
"""

from __future__ import annotations

import json
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 120


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def set_options(text: str, section: str, lines: str) -> str:
    """A shingle.toml's text with ``lines`` put first in ``[section]``."""
    return text.replace(f"[{section}]\n", f"[{section}]\n{lines}", 1)


def init_head(home: Path, *options: str) -> None:
    """`shingle init HOME OPTIONS...`: the first head's config, catalog and drives."""
    subprocess.run(
        [sys.executable, "-m", "appliance.cli", "init", str(home), *options],
        check=True,
        capture_output=True,
        cwd=REPO,
    )


class HeadProcesses:
    """`shingle serve` of each folder in ``homes`` (its shingle.toml) on its port of ``ports``."""

    def __init__(self, homes: list[Path], ports: list[int]):
        self.homes, self.ports = homes, ports
        self.procs: list[subprocess.Popen] = []

    def start(self) -> None:
        for home, port in zip(self.homes, self.ports, strict=True):
            log = home / "serve.log"
            with open(log, "w") as out:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "appliance.cli", "-c", str(home / "shingle.toml")]
                    + ["serve", "--no-web", "--nfs-port", str(port)],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=REPO,
                )
            self.procs.append(proc)
            deadline = time.monotonic() + START_TIMEOUT_S
            while "nfs://" not in log.read_text(errors="replace"):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"head {home.name} did not start: {log.read_text()[-2000:]}")
                time.sleep(0.2)

    def cpu(self) -> float:
        total = 0.0
        for proc in self.procs:
            times = psutil.Process(proc.pid).cpu_times()
            total += times.user + times.system
        return total

    def stop(self) -> None:
        for proc in self.procs:
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs = []


def alternated(
    layouts: list[str], rounds: int, measure: Callable[[str, int], dict], digits: int = 2
) -> dict[str, list[dict]]:
    """``measure(layout, round)`` of every layout in each round, odd rounds in reverse order;
    each result printed as it comes. The results by layout, in round order."""
    results: dict[str, list[dict]] = {layout: [] for layout in layouts}
    for round_ in range(rounds):
        for layout in layouts if round_ % 2 == 0 else layouts[::-1]:
            got = measure(layout, round_)
            results[layout].append(got)
            shown = json.dumps({k: round(v, digits) for k, v in got.items()})
            print(f"round {round_} {layout}: {shown}", flush=True)
    return results


def medians(results: dict[str, list[dict]], digits: int = 2) -> dict[str, dict[str, float]]:
    """Each layout's median of every figure, printed one line per layout."""
    summary = {}
    for layout, runs in results.items():
        summary[layout] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        shown = " ".join(f"{k}={v:.{digits}f}" for k, v in summary[layout].items())
        print(f"{layout}: {shown}")
    return summary
