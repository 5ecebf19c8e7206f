"""Benchmark of the data lifecycle (issue 5), on emulated zoned drives without NFS.

a. Checkpoint workload: 20 checkpoints with keep-last-3 retention on a volume
   about 80 % full. Each checkpoint is one large sequential model file plus small
   files written in 4 KiB pieces out of order (optimizer/rng state), and the run
   keeps small long-lived files (metrics) that never die. Retention, tiering and
   cleaning run after each checkpoint, cleaning only as far as free zones require.
   Media bytes (every fragment append, counted by the SMR model on each drive)
   per user byte, for
     - classes: small out-of-order writes go to hot (3 copies; the data path
       places small flushes there) and are tiered to warm; large sequential
       files go straight to warm (8+2);
     - one class: every file pinned to warm, interleaved in the same bands.
   ``cleaning_wa`` divides by the redundancy floor (user bytes x (k+m)/k of warm):
   1.0 means nothing was written twice. The kept files are read back and checked.
b. Rebuild: a drive fails under ~200 MB of data; rebuild MB/s (fragment bytes
   written), against the data path's own write MB/s for the same data in this run.
c. Tiering: hot -> warm MB/s, and a concurrent sequential reader's MB/s (read
   cache 1 MiB, so it reads the drives) with and without tiering running.
d. Cold compression: a realistic mix (token shards of uint16 and uint32 ids, Adam
   optimizer states as float32 with zeros and bf16-precision mantissas, JSON
   lines) tiered warm -> cold into 8+2 stripes with zstd and, on a second volume,
   without; per kind the ratio (user bytes per stored byte), media bytes, the
   tiering CPU seconds per MiB spent compressing, and a cold sequential read's
   MB/s and CPU seconds per MiB (1 MiB reads, the read cache emptied first) of
   the compressed data against the same data stored raw.

    .venv/bin/python bench/lifecycle.py [--quick] [--json] [--only a,b,c,d]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from engine.base import errors  # noqa: E402
from engine.catalog import Catalog, upgrade  # noqa: E402
from engine.catalog.models import Inode  # noqa: E402
from engine.coding.erasure import load_policies  # noqa: E402
from engine.datapath import DataPath  # noqa: E402
from engine.drives import SmrModel, format_emulated  # noqa: E402
from engine.lifecycle import drives as drive_states  # noqa: E402
from engine.lifecycle.cleaning import Cleaner  # noqa: E402
from engine.lifecycle.rebuild import rebuild  # noqa: E402
from engine.lifecycle.tiering import Tiering, TieringPolicy  # noqa: E402
from engine.namespace import ROOT, Namespace  # noqa: E402
from engine.snapshots.retention import RetentionService  # noqa: E402

KiB, MiB = 1 << 10, 1 << 20
INODES = Inode.__table__


def geometry(quick: bool) -> dict:
    if quick:
        return {
            "drives": 10,
            "zones": 34,
            "zone": MiB,
            "fragment": 32 * KiB,
            "checkpoints": 20,
            "small_files": 6,
            "metrics": 24 * KiB,
            "rebuild_bytes": 60 * MiB,
            "tier_bytes": 24 * MiB,
        }
    return {
        "drives": 10,
        "zones": 48,
        "zone": 2 * MiB,
        "fragment": 64 * KiB,
        "checkpoints": 20,
        "small_files": 8,
        "metrics": 32 * KiB,
        "rebuild_bytes": 200 * MiB,
        "tier_bytes": 64 * MiB,
    }


class Volume:
    def __init__(
        self,
        root: Path,
        g: dict,
        *,
        drives: int | None = None,
        cache_bytes: int = 256 * MiB,
        model: bool = True,
    ):
        root.mkdir(parents=True, exist_ok=True)
        url = f"sqlite:///{root}/catalog.db"
        upgrade(url)
        self.catalog = Catalog(url)
        frag = g["fragment"]
        self.policies = load_policies(
            {
                "hot": {"fragment_size": frag},
                "warm": {"k": 8, "m": 2, "fragment_size": frag},
                "cold": {"k": 8, "m": 2, "fragment_size": frag, "compression": None},
            }
        )
        self.drive_ids = format_emulated(
            self.catalog, root / "drives", drives or g["drives"], g["zones"] * g["zone"], g["zone"]
        )
        self.model = SmrModel(band_size=g["zone"]) if model else None
        self.data = DataPath(
            self.catalog,
            self.policies,
            reserve_zones=2,
            smr_model=self.model,
            cache_bytes=cache_bytes,
        )
        self.ns = Namespace(self.catalog, data=self.data)

    def media_bytes(self) -> int:
        return self.model.report()["host_write_bytes"] if self.model else 0

    def mkdirs(self, path: str):
        attr = self.ns.getattr(self.ns.root_ino)
        for part in [p for p in path.split("/") if p]:
            try:
                attr = self.ns.lookup(ROOT, attr.ino, part)
            except errors.NotFound:
                attr = self.ns.mkdir(ROOT, attr.ino, part)
        return attr

    def create(self, path: str, band_class: str | None = None):
        parent, name = path.rsplit("/", 1)
        folder = self.mkdirs(parent)
        try:
            self.ns.unlink(ROOT, folder.ino, name)  # what a write refused for space left behind
        except errors.NotFound:
            pass
        made = self.ns.create(ROOT, folder.ino, name)
        if band_class:
            self.catalog.run(
                lambda c: c.execute(
                    INODES.update().where(INODES.c.ino == made.ino).values(band_class=band_class)
                )
            )
        return made

    def unpin(self, ino: int) -> None:
        self.catalog.run(
            lambda c: c.execute(INODES.update().where(INODES.c.ino == ino).values(band_class=None))
        )

    def fill_fraction(self) -> float:
        total, free = self.data.capacity()
        return 1 - free / total if total else 0.0

    def close(self):
        self.data.close()
        self.catalog.close()


# -- a. checkpoint workload -------------------------------------------------------------------
def checkpoint_workload(root: Path, g: dict, classes: bool) -> dict:
    vol = Volume(root, g)
    warm = vol.policies["warm"]
    retention = RetentionService(vol.ns, vol.catalog)
    retention.add_rule("/ckpt/step-*", keep=3, order_by="name")
    tiering = Tiering(vol.ns, vol.data, vol.catalog, TieringPolicy(hot_to_warm_after_s=0))
    cleaner = Cleaner(vol.data, vol.catalog)
    total, _free = vol.data.capacity()
    # 3 kept + 1 being written + the long-lived small files: about 80 % of the volume
    model_bytes = int(0.8 * total / 4) - g["small_files"] * 32 * KiB - 2 * MiB
    model_bytes -= model_bytes % MiB
    # cleaning keeps room for one more checkpoint on every drive (a writer never has to wait)
    zones_per_checkpoint = (
        -(-int(model_bytes * warm.width / warm.k) // (g["drives"] * g["zone"])) + 1
    )
    free_target = vol.data.reserve_zones + zones_per_checkpoint
    rng = random.Random(5)
    user = 0
    stats = {
        "cleaning_bytes": 0,
        "tiering_media_bytes": 0,
        "zones_reset_by_cleaning": 0,
        "stalls": 0,
        "peak_fill": 0.0,
    }
    chunk = bytes(rng.getrandbits(8) for _ in range(MiB))
    started = time.perf_counter()

    def throttled(fn, *args, **kwargs):
        """A write refused for space waits for cleaning and goes on (a throttled writer)."""
        for _attempt in range(5):
            try:
                return fn(*args, **kwargs)
            except errors.NoSpace as exc:
                if os.environ.get("SHINGLE_BENCH_DEBUG"):
                    print(f"stall in {fn.__name__}: {exc}", file=sys.stderr)
                stats["stalls"] += 1
                report = cleaner.run(target_free_zones=free_target)
                stats["cleaning_bytes"] += report.bytes_copied
        return fn(*args, **kwargs)

    for step in range(g["checkpoints"]):
        base = f"/ckpt/step-{step:03d}"
        made = vol.create(f"{base}/model.pt")
        for pos in range(0, model_bytes, MiB):
            throttled(vol.ns.write, made.ino, pos, chunk[: min(MiB, model_bytes - pos)])
        throttled(vol.ns.commit, made.ino)
        user += model_bytes
        for n in range(g["small_files"]):
            size = rng.randint(4, 32) * KiB
            # classes: the data path places these small flushes in hot by
            # itself; one class: pinned warm
            made = vol.create(f"{base}/state-{n}.bin", None if classes else "warm")
            pieces = list(range(0, size, 4 * KiB))
            rng.shuffle(pieces)  # out of order: the small random-write pattern
            for pos in pieces:
                throttled(vol.ns.write, made.ino, pos, chunk[pos : pos + 4 * KiB], stable=True)
            user += size
        made = vol.create(f"/logs/metrics-{step:03d}.json", None if classes else "warm")
        for pos in range(0, g["metrics"], 4 * KiB):
            throttled(vol.ns.write, made.ino, pos, chunk[pos : pos + 4 * KiB], stable=True)
        user += g["metrics"]
        stats["peak_fill"] = max(stats["peak_fill"], vol.fill_fraction())
        retention.run()
        before = vol.media_bytes()
        tiering.run()
        stats["tiering_media_bytes"] += vol.media_bytes() - before
        report = cleaner.run(target_free_zones=free_target)
        stats["cleaning_bytes"] += report.bytes_copied
        stats["zones_reset_by_cleaning"] += report.zones_reset
    elapsed = time.perf_counter() - started
    media = vol.media_bytes()
    # every byte the workload kept must read back
    model_sum = hashlib.sha256(
        b"".join(chunk[: min(MiB, model_bytes - pos)] for pos in range(0, model_bytes, MiB))
    ).hexdigest()
    kept = [e.name for e in vol.ns.readdir(ROOT, vol.ns.resolve("/ckpt").ino)[0]]
    for name in kept:
        attr = vol.ns.resolve(f"/ckpt/{name}/model.pt")
        if hashlib.sha256(vol.ns.read(attr.ino, 0, attr.size)).hexdigest() != model_sum:
            raise AssertionError(f"/ckpt/{name}/model.pt does not read back what was written")
    for step in range(g["checkpoints"]):
        attr = vol.ns.resolve(f"/logs/metrics-{step:03d}.json")
        if vol.ns.read(attr.ino, 0, attr.size) != chunk[: g["metrics"]]:
            raise AssertionError(
                f"/logs/metrics-{step:03d}.json does not read back what was written"
            )
    floor = user * warm.width / warm.k
    result = {
        "mode": "classes" if classes else "one class",
        "checkpoints": g["checkpoints"],
        "model_file_MiB": model_bytes / MiB,
        "user_bytes": user,
        "media_bytes": media,
        "media_per_user_byte": round(media / user, 4),
        "cleaning_wa": round(media / floor, 4),
        "peak_fill": round(stats["peak_fill"], 3),
        "cleaning_bytes": stats["cleaning_bytes"],
        "tiering_media_bytes": stats["tiering_media_bytes"],
        "zones_reset_by_cleaning": stats["zones_reset_by_cleaning"],
        "write_stalls": stats["stalls"],
        "seconds": round(elapsed, 1),
    }
    vol.close()
    return result


# -- b. rebuild ------------------------------------------------------------------------------------
def rebuild_bench(root: Path, g: dict) -> dict:
    vol = Volume(
        root,
        {**g, "zones": max(g["zones"], 8 + g["rebuild_bytes"] // (8 * g["zone"]))},
        drives=12,
        model=False,
    )
    chunk = random.Random(9).randbytes(MiB)
    files = 8
    per_file = g["rebuild_bytes"] // files
    started = time.perf_counter()
    for n in range(files):
        made = vol.create(f"/data/f{n}")
        for pos in range(0, per_file, MiB):
            vol.ns.write(made.ino, pos, chunk)
        vol.ns.commit(made.ino)
    write_s = time.perf_counter() - started
    drive_states.fail_drive(vol.catalog, vol.drive_ids[0])
    reduced = drive_states.redundancy_status(vol.catalog).reduced
    report = rebuild(vol.data, vol.catalog)
    vol.close()
    write_mbps = files * per_file / 1e6 / write_s
    return {
        "user_MB": round(files * per_file / 1e6, 1),
        "stripes_reduced_before": reduced,
        "stripes_reduced_after": report.status["reduced"],
        "rebuilt_MB": round(report.bytes_written / 1e6, 1),
        "rebuild_MBps": round(report.mb_per_s, 1),
        "reference_write_MBps": round(write_mbps, 1),
        "rebuild_vs_write": round(report.mb_per_s / write_mbps, 3) if write_mbps else None,
    }


# -- c. tiering and a concurrent reader ------------------------------------------------------------
def tiering_bench(root: Path, g: dict) -> dict:
    vol = Volume(
        root,
        {**g, "zones": max(g["zones"], 16 + 8 * g["tier_bytes"] // (g["drives"] * g["zone"]))},
        cache_bytes=MiB,
        model=False,
    )
    chunk = random.Random(3).randbytes(MiB)
    reader_file = vol.create("/read/big")
    for pos in range(0, g["tier_bytes"], MiB):
        vol.ns.write(reader_file.ino, pos, chunk)
    vol.ns.commit(reader_file.ino)
    hot = []
    for n in range(8):
        made = vol.create(f"/hot/f{n}", "hot")
        for pos in range(0, g["tier_bytes"] // 8, MiB):
            vol.ns.write(made.ino, pos, chunk)
        vol.ns.commit(made.ino)
        vol.unpin(made.ino)
        hot.append(made)
    size = g["tier_bytes"]

    def read_for(seconds: float, stop: threading.Event | None = None) -> float:
        done, start = 0, time.perf_counter()
        pos = 0
        while time.perf_counter() - start < seconds and not (stop and stop.is_set()):
            done += len(vol.ns.read(reader_file.ino, pos, MiB))
            pos = (pos + MiB) % size
        return done / 1e6 / (time.perf_counter() - start)

    def with_tiering(limit):
        stop = threading.Event()
        result: dict = {}

        def tier():
            policy = TieringPolicy(hot_to_warm_after_s=0, bytes_per_s=limit)
            result["report"] = Tiering(vol.ns, vol.data, vol.catalog, policy).run()
            stop.set()

        mover = threading.Thread(target=tier)
        mover.start()
        during = read_for(300.0, stop)
        mover.join()
        return result["report"], during

    alone = read_for(3.0)
    report, during = with_tiering(None)
    # the same move again, back from warm to hot, then hot -> warm limited to
    # 20 MB/s of media writes
    for made in hot:
        vol.catalog.run(
            lambda c, ino=made.ino: c.execute(
                INODES.update().where(INODES.c.ino == ino).values(band_class="hot")
            )
        )
    Tiering(vol.ns, vol.data, vol.catalog, TieringPolicy()).run()
    for made in hot:
        vol.unpin(made.ino)
    limited, during_limited = with_tiering(20e6)
    vol.close()
    return {
        "moved_MB": round(report.bytes_moved / 1e6, 1),
        "tiering_MBps": round(report.mb_per_s, 1),
        "reader_alone_MBps": round(alone, 1),
        "reader_during_tiering_MBps": round(during, 1),
        "reader_ratio": round(during / alone, 3) if alone else None,
        "tiering_limited_MBps": round(limited.mb_per_s, 1),
        "reader_during_limited_MBps": round(during_limited, 1),
        "reader_ratio_limited": round(during_limited / alone, 3) if alone else None,
    }


# -- d. cold compression ---------------------------------------------------------------------
READ_REPEATS = 3


def data_mix(each: int, seed: int = 7) -> dict[str, bytes]:
    """``each`` bytes of every kind a training cluster keeps in cold storage."""
    import numpy as np

    rng = np.random.default_rng(seed)
    tokens16 = rng.integers(0, 50257, each // 2, dtype=np.uint16)  # a GPT-2 vocabulary
    tokens32 = rng.integers(0, 128256, each // 4, dtype=np.uint32)  # a Llama-3 vocabulary
    # Adam moments of a model trained in bf16: fp32 copies of bf16 values (the low 16 mantissa
    # bits zero), and a quarter of the rows never updated (embeddings of unseen tokens: zeros)
    rows = each // 4 // 1024
    exp_avg = (rng.standard_normal((rows, 1024)) * 1e-3).astype(np.float32)
    exp_avg[rng.random(rows) < 0.25] = 0.0
    exp_avg_sq = np.square(exp_avg)
    state = np.concatenate([exp_avg.ravel()[: rows * 512], exp_avg_sq.ravel()[: rows * 512]])
    state = (state.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    lines, size, step = [], 0, 0
    while size < each:
        lines.append(
            json.dumps(
                {
                    "step": step,
                    "loss": round(float(2.0 + rng.random()), 6),
                    "lr": 3e-4,
                    "grad_norm": round(float(rng.random()), 4),
                    "tokens_seen": step * 4_194_304,
                    "rank": step % 64,
                }
            )
            + "\n"
        )
        size += len(lines[-1])
        step += 1
    return {
        "tokens_uint16": tokens16.tobytes()[:each],
        "tokens_uint32": tokens32.tobytes()[:each],
        "optimizer_fp32": state.tobytes()[:each],
        "jsonl": "".join(lines).encode()[:each],
    }


def cold_volume(root: Path, fragment: int, zone: int, zones: int, compression: str | None):
    root.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{root}/catalog.db"
    upgrade(url)
    catalog = Catalog(url)
    policies = load_policies(
        {
            "hot": {"fragment_size": fragment},
            "warm": {"k": 8, "m": 2, "fragment_size": fragment},
            "cold": {"k": 8, "m": 2, "fragment_size": fragment, "compression": compression},
        }
    )
    format_emulated(catalog, root / "drives", 10, zones * zone, zone, preallocate=False)
    data = DataPath(catalog, policies, reserve_zones=2)
    return catalog, data, Namespace(catalog, data=data)


def compression_bench(root: Path, quick: bool) -> dict:
    from sqlalchemy import func, select

    from engine.catalog.models import Extent, Fragment, Stripe

    each = 16 * MiB if quick else 64 * MiB
    fragment = 256 * KiB if quick else MiB  # cold's default: 1 MiB fragments, 8 MiB stripes
    zone = 4 * fragment + 64 * KiB
    mix = data_mix(each)
    # user bytes in warm then cold, each 10/8 on media, plus room to spare
    zones = 8 + int(2.5 * len(mix) * each * 10 / 8 / 10 / zone)
    st, fr, ex = Stripe.__table__, Fragment.__table__, Extent.__table__
    out: dict[str, dict] = {}
    for label, codec in (("zstd", "zstd"), ("raw", None)):
        catalog, data, ns = cold_volume(root / label, fragment, zone, zones, codec)
        tiering = Tiering(ns, data, catalog, TieringPolicy())
        try:
            for kind, payload in mix.items():
                made = ns.create(ROOT, ns.root_ino, kind)
                for pos in range(0, len(payload), MiB):
                    ns.write(made.ino, pos, payload[pos : pos + MiB])
                ns.commit(made.ino)
                tiering.packing = packing = type(tiering.packing)()
                move_started = time.perf_counter()
                tiering.move_file(made.ino, "cold")
                move_s = time.perf_counter() - move_started

                def sizes(conn, ino=made.ino):
                    ids = select(ex.c.stripe_id).where(ex.c.ino == ino)
                    stored = func.coalesce(st.c.stored_length, st.c.data_length)
                    row = conn.execute(
                        select(func.sum(st.c.data_length), func.sum(stored)).where(st.c.id.in_(ids))
                    ).one()
                    media = conn.execute(
                        select(func.sum(fr.c.length)).where(fr.c.stripe_id.in_(ids))
                    ).scalar()
                    return int(row[0]), int(row[1]), int(media)

                user, stored, media = catalog.read(sizes)
                before = dict(data.reader.stats)
                walls, cpus = [], []
                for _repeat in range(READ_REPEATS):  # the median of a few: the machine is shared
                    data.reader.drop_cache()
                    cpu0, wall0 = time.process_time(), time.perf_counter()
                    got = bytearray()
                    for pos in range(0, len(payload), MiB):
                        got += ns.read(made.ino, pos, MiB)
                    walls.append(time.perf_counter() - wall0)
                    cpus.append(time.process_time() - cpu0)
                    if got != payload:
                        raise AssertionError(f"{kind} ({label}) does not read back as written")
                wall, cpu = sorted(walls)[len(walls) // 2], sorted(cpus)[len(cpus) // 2]
                mib = len(payload) / MiB
                out.setdefault(kind, {}).update(
                    {
                        f"{label}_ratio": round(user / stored, 3),
                        f"{label}_media_MiB": round(media / MiB, 2),
                        f"{label}_tier_s": round(move_s, 2),
                        f"{label}_read_MBps": round(len(payload) / 1e6 / wall, 1),
                        f"{label}_read_cpu_ms_per_MiB": round(1000 * cpu / mib, 2),
                    }
                )
                if codec is not None:
                    out[kind]["zstd_stripes_compressed"] = packing.stripes_compressed
                    out[kind]["zstd_stripes_raw"] = packing.stripes_stored_raw
                    out[kind]["zstd_compress_cpu_ms_per_MiB"] = round(
                        1000 * packing.compress_cpu_s / mib, 2
                    )
                    spent = data.reader.stats["decompress_s"] - before["decompress_s"]
                    out[kind]["zstd_decompress_cpu_ms_per_MiB"] = round(
                        1000 * spent / READ_REPEATS / mib, 2
                    )
        finally:
            data.close()
            catalog.close()
            shutil.rmtree(root / label, ignore_errors=True)
    total_user = sum(len(p) for p in mix.values())
    out["all"] = {
        "user_MiB": round(total_user / MiB, 1),
        "zstd_media_MiB": round(sum(v["zstd_media_MiB"] for v in out.values()), 2),
        "raw_media_MiB": round(sum(v["raw_media_MiB"] for k, v in out.items() if k != "all"), 2),
        "os_load_1m": round(os.getloadavg()[0], 2),
    }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smaller volume (about a minute)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--only", default="a,b,c,d", help="parts to run, comma separated (default a,b,c,d)"
    )
    args = parser.parse_args()
    g = geometry(args.quick)
    parts = set(args.only.split(","))
    tmp = Path(tempfile.mkdtemp(prefix="shingle-bench-lifecycle-"))
    results: dict[str, dict] = {}
    try:
        if "a" in parts:
            results["checkpoint_classes"] = checkpoint_workload(tmp / "a1", g, classes=True)
            results["checkpoint_one_class"] = checkpoint_workload(tmp / "a2", g, classes=False)
        if "b" in parts:
            results["rebuild"] = rebuild_bench(tmp / "b", g)
        if "c" in parts:
            results["tiering"] = tiering_bench(tmp / "c", g)
        if "d" in parts:
            for kind, values in compression_bench(tmp / "d", args.quick).items():
                results[f"cold_compression_{kind}"] = values
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for name, values in results.items():
            print(f"{name}:")
            for key, value in values.items():
                print(f"  {key:28} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
