"""Training workloads through NFS with fsspec (nfs4fs): checkpoints and dataset streaming.

    .venv/bin/python bench/training.py --port P [--mode full|quick|smoke] [--server NAME]
        [--local-dir DIR] [--catalog-url URL] [--json]

Checkpoints (``/bench/train/ckpt/{torch,safetensors,zarr}/step-N``): a model
state dict (a few hundred MiB in full mode) saved with torch.save, with
safetensors, and as a zarr array; each is written under a temporary
``.step-N.*.tmp`` name, committed (closed: nfs4fs writes FILE_SYNC, so the
bytes are stable when close returns; its size is checked), then atomically
renamed to ``step-N``. A keep-last-N rule (``/bench/train/ckpt/*/step-*``,
keep 2, by natural name order) then prunes the older ones: on shingle the
plan comes from shingle's own engine.snapshots.retention.RetentionService over the
server's catalog (its preview, which skips dot-named temporaries and entries
held open), and the deletions go through NFS so the daemon frees the data; on
any other server the same rule is applied by the client. Every survivor is
loaded back and compared.

Dataset streaming: a tokenized corpus of numpy uint16 shards is read
sequentially by a torch DataLoader with several workers through fsspec, then
the same DataLoader reads the same shards from local disk; the ratio of
samples/s is reported. The sum of all tokens is checked on both sides.

Needs the ``bench`` extra (torch, safetensors, zarr): pip install -e '.[bench]'.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import shutil
import sys
import time
import traceback
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# first, even when PYTHONPATH has it: bench/ (this script's folder) holds an engine.py too
sys.path.insert(0, str(REPO))

try:  # the dataset class must live at module level to reach spawned DataLoader workers
    from torch.utils.data import IterableDataset
except ImportError:  # compare.py checks for torch before it runs this file
    IterableDataset = object

MiB = 1 << 20
ROOT = "/bench/train"
CKPT = f"{ROOT}/ckpt"
RULE_PATTERN = f"{CKPT}/*/step-*"
KEEP = 2
FORMATS = ("torch", "safetensors", "zarr")

SIZES = {  # model bytes, steps, zarr bytes, shards x shard bytes, DataLoader workers
    "full": dict(
        model_bytes=320 * MiB,
        steps=3,
        zarr_bytes=64 * MiB,
        shards=16,
        shard_bytes=32 * MiB,
        workers=4,
    ),
    "quick": dict(
        model_bytes=32 * MiB, steps=3, zarr_bytes=16 * MiB, shards=8, shard_bytes=8 * MiB, workers=4
    ),
    "smoke": dict(
        model_bytes=1 * MiB,
        steps=3,
        zarr_bytes=256 * 1024,
        shards=2,
        shard_bytes=256 * 1024,
        workers=0,
    ),
}
SEQ_LEN = 2048  # tokens per sample
BATCH = 16


def nfs_fs(port: int, **kw):
    import fsspec
    import nfs4fs  # noqa: F401  (registers the nfs4 protocol)

    return fsspec.filesystem(
        "nfs4",
        host=f"127.0.0.1:{port}",
        root="export",
        auth="auth_sys",
        minor_version=1,
        skip_instance_cache=True,
        request_timeout=120.0,
        read_all_max_total_bytes=2 << 30,
        **kw,
    )  # whole checkpoints are read at once


def state_dict(total_bytes: int, seed: int):
    """A transformer-shaped state dict of float32 tensors adding up to about total_bytes."""
    import torch

    g = torch.Generator().manual_seed(seed)
    width = 1024 if total_bytes >= 64 * MiB else 128
    layer = 4 * width * width * 4  # qkv+o in float32
    layers = max(1, total_bytes // layer)
    sd = {}
    for i in range(layers):
        sd[f"layers.{i}.attn.qkv.weight"] = torch.randn(3 * width, width, generator=g)
        sd[f"layers.{i}.attn.out.weight"] = torch.randn(width, width, generator=g)
        sd[f"layers.{i}.norm.weight"] = torch.ones(width)
    return sd


def sd_bytes(sd) -> int:
    return sum(t.numel() * t.element_size() for t in sd.values())


def same(a, b) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


class Checkpointer:
    """Write-temp, commit, rename; then keep-last-N."""

    def __init__(self, fs, port: int):
        self.fs, self.port = fs, port
        self.zfs = None

    def commit_rename(self, tmp: str, final: str, expect_size: int | None) -> None:
        if expect_size is not None:
            size = self.fs.info(tmp)["size"]
            if size != expect_size:
                raise RuntimeError(
                    f"{tmp}: {size} bytes on the server after close, wrote {expect_size}"
                )
        self.fs.mv(tmp, final)

    def save_torch(self, sd, step: int) -> int:
        import io

        import torch

        buf = io.BytesIO()
        torch.save(
            sd, buf
        )  # serialized first: the timing below is the NFS part plus torch's framing
        data = buf.getbuffer()
        tmp, final = f"{CKPT}/torch/.step-{step}.pt.tmp", f"{CKPT}/torch/step-{step}"
        with self.fs.open(tmp, "wb") as f:
            for off in range(0, len(data), 8 * MiB):
                f.write(data[off : off + 8 * MiB])
        self.commit_rename(tmp, final, len(data))
        return len(data)

    def save_torch_direct(self, sd, step: int) -> int:
        """torch.save straight into the NFS file object (what training code does)."""
        import torch

        tmp, final = f"{CKPT}/torch/.step-{step}.pt.tmp", f"{CKPT}/torch/step-{step}"
        # torch.save issues many small writes: buffer them into 8 MiB WRITEs as a
        # training job would (nfs4fs otherwise sends each as its own FILE_SYNC WRITE)
        with self.fs.open(tmp, "wb", write_buffering=True, block_size=8 * MiB) as f:
            torch.save(sd, f)
        size = self.fs.info(tmp)["size"]
        self.commit_rename(tmp, final, None)
        return size

    def load_torch(self, step: int):
        import torch

        with self.fs.open(f"{CKPT}/torch/step-{step}", "rb") as f:
            return torch.load(f, weights_only=True)

    def save_safetensors(self, sd, step: int) -> int:
        from safetensors.torch import save

        data = save(sd)
        tmp, final = f"{CKPT}/safetensors/.step-{step}.st.tmp", f"{CKPT}/safetensors/step-{step}"
        with self.fs.open(tmp, "wb") as f:
            f.write(data)
        self.commit_rename(tmp, final, len(data))
        return len(data)

    def load_safetensors(self, step: int):
        from safetensors.torch import load

        with self.fs.open(f"{CKPT}/safetensors/step-{step}", "rb") as f:  # cat_file caps at 16 MiB
            return load(f.read())

    def zarr_store(self, path: str, read_only: bool = False):
        from fsspec.implementations.asyn_wrapper import AsyncFileSystemWrapper
        from zarr.storage import FsspecStore

        if self.zfs is None:
            # zarr writes chunk files under directories it does not create itself
            self.zfs = AsyncFileSystemWrapper(nfs_fs(self.port, auto_mkdir=True))
        return FsspecStore(self.zfs, path=path, read_only=read_only)

    def save_zarr(self, array, step: int) -> int:
        import zarr

        tmp, final = f"{CKPT}/zarr/.step-{step}.zarr.tmp", f"{CKPT}/zarr/step-{step}"
        z = zarr.create_array(
            self.zarr_store(tmp),
            shape=array.shape,
            chunks=(max(1, array.shape[0] // 8), array.shape[1]),
            dtype=array.dtype,
            compressors=None,
        )
        z[:] = array
        self.fs.mv(tmp, final)  # one RENAME of the directory: readers see all of it or none
        return array.nbytes

    def load_zarr(self, step: int):
        import zarr

        return zarr.open_array(
            self.zarr_store(f"{CKPT}/zarr/step-{step}", read_only=True), mode="r"
        )[:]


# -- keep-last-N ---------------------------------------------------------------------------
def prune_plan_shingle(catalog_url: str) -> tuple[list[str], str]:
    """Paths shingle's RetentionService would delete under RULE_PATTERN keep KEEP."""
    from engine.catalog import Catalog
    from engine.namespace import Namespace
    from engine.snapshots.retention import RetentionService

    catalog = Catalog(catalog_url)
    try:
        # settle_s: the writes came from NFS clients, whose opens this process cannot see
        service = RetentionService(Namespace(catalog), catalog, settle_s=0.0)
        rule = next((r for r in service.list_rules() if r.pattern == RULE_PATTERN), None)
        rule_id = (
            rule.id
            if rule
            else service.add_rule(
                RULE_PATTERN, KEEP, action="delete", order_by="name", actor="bench/training.py"
            )
        )
        plan = service.preview(rule_id)
    finally:
        catalog.close()
    skipped = [p for p in plan if p.action == "skip"]
    if skipped:
        raise RuntimeError(f"retention skipped {[(p.path, p.reason) for p in skipped]}")
    return (
        [p.path for p in plan if p.action == "delete"],
        f"shingle engine.snapshots.retention.RetentionService rule {rule_id} (preview), "
        f"deletions over NFS",
    )


def prune_plan_client(fs) -> tuple[list[str], str]:
    """The same rule evaluated by the client (servers without shingle's engine)."""
    from engine.snapshots.retention import natural_key

    doomed = []
    for d in fs.ls(CKPT, detail=False):
        d = "/" + d.split("://", 1)[-1].lstrip("/")
        names = sorted(
            (n.rstrip("/").rsplit("/", 1)[-1] for n in fs.ls(d, detail=False)), key=natural_key
        )
        names = [n for n in names if fnmatch.fnmatchcase(n, "step-*")]
        doomed += [f"{d}/{n}" for n in names[:-KEEP]]
    return doomed, "client-side keep-last-N (engine.snapshots.retention.natural_key order)"


def checkpoints(port: int, size: dict, catalog_url: str | None) -> dict:
    import numpy as np

    fs = nfs_fs(port)
    for fmt in FORMATS:
        fs.makedirs(f"{CKPT}/{fmt}", exist_ok=True)
    ck = Checkpointer(fs, port)
    out = {
        "torch_save_MBps": [],
        "torch_load_MBps": [],
        "safetensors_save_MBps": [],
        "zarr_write_MBps": [],
    }
    sds, arrays = {}, {}
    for step in range(size["steps"]):
        sd = state_dict(size["model_bytes"], seed=step)
        arr = np.random.default_rng(step).standard_normal(
            (max(8, size["zarr_bytes"] // (4 * 4096)), 4096), dtype=np.float32
        )
        t = time.perf_counter()
        n = ck.save_torch_direct(sd, step)
        out["torch_save_MBps"].append(n / (time.perf_counter() - t) / 1e6)
        t = time.perf_counter()
        back = ck.load_torch(step)
        out["torch_load_MBps"].append(n / (time.perf_counter() - t) / 1e6)
        if not same(sd, back):
            raise RuntimeError(
                f"{CKPT}/torch/step-{step}: loaded tensors differ from the saved ones"
            )
        t = time.perf_counter()
        n = ck.save_safetensors(sd, step)
        out["safetensors_save_MBps"].append(n / (time.perf_counter() - t) / 1e6)
        t = time.perf_counter()
        n = ck.save_zarr(arr, step)
        out["zarr_write_MBps"].append(n / (time.perf_counter() - t) / 1e6)
        sds[step], arrays[step] = sd, arr
    model_bytes = sd_bytes(sds[0])
    if catalog_url:
        doomed, method = prune_plan_shingle(catalog_url)
    else:
        doomed, method = prune_plan_client(fs)
    for path in doomed:
        fs.rm(path, recursive=True)
    kept = {}
    want = [f"step-{s}" for s in range(size["steps"])][-KEEP:]
    for fmt in FORMATS:
        names = sorted(
            n.rstrip("/").rsplit("/", 1)[-1] for n in fs.ls(f"{CKPT}/{fmt}", detail=False)
        )
        kept[fmt] = names
        if names != want:
            raise RuntimeError(
                f"{CKPT}/{fmt} holds {names} after keep-last-{KEEP}, expected {want}"
            )
    for step in (int(w.split("-")[1]) for w in want):  # survivors are intact
        if not same(sds[step], ck.load_safetensors(step)):
            raise RuntimeError(f"{CKPT}/safetensors/step-{step}: differs after pruning")
        if not np.array_equal(arrays[step], ck.load_zarr(step)):
            raise RuntimeError(f"{CKPT}/zarr/step-{step}: differs after pruning")
    fs.rm(CKPT, recursive=True)
    fs.close()
    metrics = {k: round(float(np.median(v)), 1) for k, v in out.items()}
    return {
        "metrics": metrics,
        "model_MiB": round(model_bytes / MiB, 1),
        "pruned": doomed,
        "kept": kept,
        "prune_method": method,
    }


# -- dataset streaming ---------------------------------------------------------------------------
class ShardStream(IterableDataset):
    """Iterable dataset over uint16 token shards; each worker reads its own shards sequentially."""

    def __init__(self, paths: list[str], port: int | None):
        self.paths, self.port = paths, port

    def __iter__(self):
        import numpy as np
        import torch

        info = torch.utils.data.get_worker_info()
        wid, nw = (info.id, info.num_workers) if info else (0, 1)
        fs = nfs_fs(self.port) if self.port else None  # one connection per worker, made after fork
        chunk = SEQ_LEN * 2 * 256
        for path in self.paths[wid::nw]:
            f = fs.open(path, "rb", cache_type="none") if fs else open(path, "rb", buffering=0)
            with f:
                while True:
                    data = f.read(chunk)
                    if not data:
                        break
                    tokens = np.frombuffer(data, dtype=np.uint16)
                    for row in tokens[: len(tokens) // SEQ_LEN * SEQ_LEN].reshape(-1, SEQ_LEN):
                        yield torch.from_numpy(row.astype(np.int32))
        if fs:
            fs.close()


def stream(paths, port, workers: int) -> tuple[float, int, int]:
    import torch

    ds = ShardStream(paths, port)
    # spawn, not fork: a forked child inherits the parent's NFS client threads half-alive
    extra = (
        {"timeout": 120, "multiprocessing_context": "spawn"} if workers else {}
    )  # smoke: in-process
    loader = torch.utils.data.DataLoader(ds, batch_size=BATCH, num_workers=workers, **extra)
    samples = total = timed = 0
    t = None
    for batch in loader:
        if t is None:  # start the clock at the first batch: worker start-up is not I/O
            t = time.perf_counter()
        else:
            timed += batch.shape[0]
        samples += batch.shape[0]
        total += int(batch.sum())
    elapsed = time.perf_counter() - t if t is not None else 0.0
    return (timed / elapsed if elapsed > 0 else 0.0), samples, total


def dataset(port: int, size: dict, local_dir: Path) -> dict:
    import numpy as np

    fs = nfs_fs(port)
    fs.makedirs(f"{ROOT}/data", exist_ok=True)
    local_dir.mkdir(parents=True, exist_ok=True)
    remote, local, expect = [], [], 0
    tokens_per_shard = size["shard_bytes"] // 2
    for i in range(size["shards"]):
        tokens = np.random.default_rng(100 + i).integers(
            0, 50257, tokens_per_shard, dtype=np.uint16
        )
        expect += int(tokens[: tokens_per_shard // SEQ_LEN * SEQ_LEN].astype(np.int64).sum())
        data = tokens.tobytes()
        fs.pipe_file(f"{ROOT}/data/shard-{i:04d}.bin", data)
        (local_dir / f"shard-{i:04d}.bin").write_bytes(data)
        remote.append(f"{ROOT}/data/shard-{i:04d}.bin")
        local.append(str(local_dir / f"shard-{i:04d}.bin"))
    results = {}
    for name, paths, p in (("nfs", remote, port), ("local", local, None)):
        rate, samples, total = stream(paths, p, size["workers"])
        if total != expect:
            raise RuntimeError(
                f"DataLoader over {name} shards summed {total} tokens, expected {expect}"
            )
        results[name] = rate
    fs.rm(f"{ROOT}/data", recursive=True)
    fs.close()
    shutil.rmtree(local_dir, ignore_errors=True)
    return {
        "metrics": {
            "dataloader_samples_per_s": round(results["nfs"], 1),
            "dataloader_local_samples_per_s": round(results["local"], 1),
            "dataloader_vs_local": round(results["nfs"] / results["local"], 3),
        },
        "samples": samples,
        "workers": size["workers"],
        "seq_len": SEQ_LEN,
        "corpus_MiB": round(size["shards"] * size["shard_bytes"] / MiB, 1),
    }


def run(port: int, mode: str, local_dir: Path, catalog_url: str | None = None) -> dict:
    warnings.filterwarnings("ignore", message=".*asynchronous=True.*")
    size = SIZES[mode]
    ck = checkpoints(port, size, catalog_url)
    ds = dataset(port, size, local_dir)
    return {"metrics": {**ck.pop("metrics"), **ds.pop("metrics")}, "checkpoints": ck, "dataset": ds}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="training workloads through NFS (nfs4fs + torch)")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--mode", choices=sorted(SIZES), default="full")
    ap.add_argument("--server", default="?", help="label for the output")
    ap.add_argument(
        "--local-dir", default=None, help="local copy of the corpus (default: a temp folder)"
    )
    ap.add_argument("--catalog-url", help="shingle's catalog: prune with its RetentionService")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = ap.parse_args(argv)
    import tempfile

    local = (
        Path(args.local_dir) if args.local_dir else Path(tempfile.mkdtemp(prefix="bench-corpus-"))
    )
    try:
        result = run(args.port, args.mode, local, args.catalog_url)
        out = {"ok": True, "server": args.server, **result}
    except Exception as exc:  # noqa: BLE001 (reported as data to the harness)
        traceback.print_exc(file=sys.stderr)
        out = {"ok": False, "server": args.server, "error": f"{type(exc).__name__}: {exc}"[:500]}
    if args.json:
        print(json.dumps(out, default=str), flush=True)
    else:
        print(json.dumps(out, indent=2, default=str))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
