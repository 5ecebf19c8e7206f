"""Client processes whose loopback connections come from several source addresses in turn
(bench/srcaddr.c, loaded with LD_PRELOAD), so `shingle serve --heads N`, which picks a
client's head by its address, spreads one machine's benchmark clients over its heads.

    env = srcaddr.environ(2, Path("/var/tmp/work"))  # os.environ plus the preload
    subprocess.run(cmd, env=env)

``environ(count, folder)`` compiles the library into ``folder`` once (cc) and returns the
environment for a child; with ``count`` 1 it is os.environ unchanged."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "srcaddr.c"


def build(folder: Path) -> Path:
    """The preload library, compiled into ``folder`` unless it is there already."""
    lib = Path(folder) / "libsrcaddr.so"
    if not lib.exists():
        Path(folder).mkdir(parents=True, exist_ok=True)
        part = lib.with_name(f"{lib.name}.{os.getpid()}")
        subprocess.run(
            ["cc", "-O2", "-shared", "-fPIC", "-o", str(part), str(SOURCE), "-ldl"],
            check=True,
            capture_output=True,
        )
        os.replace(part, lib)  # whole, for another run looking at the same folder
    return lib


def environ(count: int, folder: Path) -> dict[str, str]:
    env = dict(os.environ)
    if count <= 1:
        return env
    lib = build(folder)
    env["LD_PRELOAD"] = " ".join(p for p in (str(lib), env.get("LD_PRELOAD", "")) if p)
    env["SHINGLE_BENCH_SOURCES"] = str(count)
    return env
