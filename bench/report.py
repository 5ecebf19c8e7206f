"""Markdown report and PNG charts of a bench/compare.py run, under bench/results/ (git-ignored).

    from bench import report
    path = report.write(result, Path("bench/results"))   # result: the dict compare.py builds

Writes ``report-<stamp>.md`` plus ``<stamp>-*.png`` and a copy as ``latest.md``.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path


def _fmt(v, digits=1) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    if isinstance(v, float) and abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}f}"


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def chart_ratios(rows, path: Path) -> Path | None:
    rows = [r for r in rows if r["ratio"] is not None or r["ganesha"] is not None]
    if not rows:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(10, max(3, 0.35 * len(rows) + 1)))
    names = [r["metric"] for r in rows]
    values = [r["ratio"] if r["ratio"] is not None else 0 for r in rows]
    colors = []
    for r in rows:
        if r["ratio"] is None:
            colors.append("#bbbbbb")
        elif r["goal"] is None:
            colors.append("#337ab7")
        elif r["goal"] is not None and r["ratio"] < r["goal"]:
            colors.append("#d9534f")
        else:
            colors.append("#5cb85c")
    ax.barh(names, values, color=colors)
    for i, r in enumerate(rows):
        if r["goal"] is not None:
            ax.plot([r["goal"], r["goal"]], [i - 0.4, i + 0.4], color="black", lw=1.5)
        label = "failed" if r["ratio"] is None else f"{r['ratio']:.2f}"
        ax.text((r["ratio"] or 0) + 0.01, i, label, va="center", fontsize=8)
    ax.axvline(1.0, color="grey", ls="--", lw=0.8)
    ax.invert_yaxis()
    ax.set_xlabel(
        "shingle / NFS-Ganesha (median; black tick = goal of issue 8; red = below goal, blue = no "
        "goal)"
    )
    ax.set_title("shingle vs NFS-Ganesha, same machine, same run")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def chart_absolute(rows, unit_filter, title: str, path: Path) -> Path | None:
    rows = [
        r
        for r in rows
        if r["unit"] in unit_filter and (r["shingle"] is not None or r["ganesha"] is not None)
    ]
    if not rows:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(10, max(3, 0.45 * len(rows) + 1)))
    y = list(range(len(rows)))
    h = 0.38
    ax.barh(
        [i - h / 2 for i in y],
        [r["shingle"] or 0 for r in rows],
        height=h,
        label="shingle",
        color="#337ab7",
    )
    ax.barh(
        [i + h / 2 for i in y],
        [r["ganesha"] or 0 for r in rows],
        height=h,
        label="NFS-Ganesha",
        color="#f0ad4e",
    )
    ax.set_yticks(y, [f"{r['metric']} ({r['unit']})" for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.legend()
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def chart_cluster(cluster: dict, path: Path) -> Path | None:
    if not cluster:
        return None
    plt = _plt()
    pred = cluster["prediction"]
    lo, hi = cluster["measured"]["ckpt80_write_s"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
    labels = ["gateway", "scale-out", "drives only", "measured"]
    a1.bar(
        labels,
        [
            pred["gateway"]["read_GBps"],
            pred["scale-out"]["read_GBps"],
            pred["drives_only"]["read_GBps"],
            cluster["measured"]["read_GBps"],
        ],
        color=["#337ab7", "#5bc0de", "#aaaaaa", "#d9534f"],
    )
    a1.set_ylabel("GB/s")
    a1.set_title("aggregate sequential read")
    a2.bar(
        labels,
        [
            pred["gateway"]["ckpt80_write_s"],
            pred["scale-out"]["ckpt80_write_s"],
            pred["drives_only"]["ckpt80_write_s"],
            (lo + hi) / 2,
        ],
        yerr=[[0, 0, 0, (hi - lo) / 2], [0, 0, 0, (hi - lo) / 2]],
        color=["#337ab7", "#5bc0de", "#aaaaaa", "#d9534f"],
    )
    a2.set_ylabel("seconds")
    a2.set_title("80 GB checkpoint write")
    fig.suptitle("pilot 12 nodes x 8 x 16 TB, 8+2 across nodes, 25 GbE: model vs measured")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(result: dict, outdir: Path) -> Path:
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    rows = result["rows"]
    charts = []
    for name, fn in (
        ("ratios", lambda p: chart_ratios(rows, p)),
        ("throughput", lambda p: chart_absolute(rows, {"MB/s"}, "throughput (median)", p)),
        (
            "operations",
            lambda p: chart_absolute(rows, {"ops/s", "IOPS"}, "operations/s (median)", p),
        ),
        ("training", lambda p: chart_absolute(rows, {"samples/s"}, "DataLoader samples/s", p)),
        ("cluster", lambda p: chart_cluster(result.get("cluster"), p)),
    ):
        try:
            made = fn(outdir / f"{stamp}-{name}.png")
        except Exception as exc:  # noqa: BLE001 (a chart must not cost the report)
            made = None
            result.setdefault("chart_errors", []).append(f"{name}: {type(exc).__name__}: {exc}")
        if made:
            charts.append((name, Path(made).name))
    md = render(result, charts)
    path = outdir / f"report-{stamp}.md"
    path.write_text(md)
    (outdir / "latest.md").write_text(md)
    (outdir / f"report-{stamp}.json").write_text(json.dumps(result, indent=2, default=str))
    return path


def render(result: dict, charts: list[tuple[str, str]]) -> str:
    rows = result["rows"]
    L = []
    L.append(f"# shingle vs NFS-Ganesha — {result['mode']} run of {result['started']}")
    L.append("")
    s, g = result["servers"].get("shingle", {}), result["servers"].get("ganesha", {})
    L.append(
        f"- host: {result['host']['platform']}, {result['host']['cpus']} CPUs, Python "
        f"{result['host']['python']}"
    )
    L.append(
        f"- shingle: {s.get('version', '?')}, 10 emulated zone-file drives of "
        f"{(s.get('drive_size') or 0) / 2**30:.1f} GiB ({(s.get('zone_size') or 0) / 2**20:.0f} "
        "MiB zones), "
        f"warm class 8+2 (isa_l_rs_vand), SQLite catalog; served by `shingle serve --no-web`"
        + (f"; restarted {s['restarts']} time(s) after exiting" if s.get("restarts") else "")
    )
    L.append(
        f"- NFS-Ganesha: {g.get('version', '?')}, VFS FSAL on a local folder, NFSv4.1 only, pNFS "
        "off, No_Root_Squash"
    )
    L.append(
        f"- clients: {', '.join(result['clients'])}; {result['reps']} repetition(s), the server "
        "order alternating per workload (A then B, B then A next repetition); values are medians"
    )
    cd = result.get("cache_drop")
    L.append(
        "- cold reads: "
        + (
            "page cache dropped with `echo 3 > /proc/sys/vm/drop_caches` after the write"
            if cd == "drop_caches"
            else "drop_caches NOT permitted: backing files evicted with posix_fadvise(DONTNEED)"
            if cd == "fadvise"
            else "no cold read ran"
        )
        + "; shingle's in-process caches (extent maps) stay warm, Ganesha's metadata cache too"
    )
    p = result.get("params", {})
    L.append(
        f"- sizes: sequential {p.get('seq_bytes', 0) / 2**20:.0f} MiB in {p.get('io', 0) // 1024} "
        f"KiB I/O; {p.get('small_files')} small files of {p.get('small_size')} B; 4 KiB random "
        f"writes for {p.get('rand_seconds')} s in a {p.get('rand_file', 0) / 2**20:.0f} MiB file; "
        f"{p.get('ckpt_writers')} checkpoint writers x {p.get('ckpt_bytes', 0) / 2**20:.0f} MiB "
        f"(temp name, rename); {p.get('shard_readers')} readers of one "
        f"{p.get('shard_bytes', 0) / 2**20:.0f} MiB shard"
    )
    L.append(f"- duration: {result['duration_s']} s")
    L.append("")
    L.append("Reproduce: `.venv/bin/python bench/compare.py` (full) or `--quick`.")
    L.append("")
    L.append("## Results (median; ratio = shingle / NFS-Ganesha)")
    L.append("")
    L.append(
        "| metric | unit | shingle | NFS-Ganesha | ratio | goal | samples (shingle / Ganesha) |"
    )
    L.append("|---|---|---:|---:|---:|---|---|")
    for r in rows:
        goal = (
            ""
            if r["goal"] is None
            else (
                f">= {r['goal']} "
                + ("met" if r["ratio"] is not None and r["ratio"] >= r["goal"] else "**missed**")
            )
        )
        samples = r.get("samples") or {}
        ss = ", ".join(_fmt(v) for v in samples.get("shingle", [])) or "failed"
        gs = ", ".join(_fmt(v) for v in samples.get("ganesha", [])) or "failed"
        L.append(
            f"| {r['metric']} | {r['unit']} | {_fmt(r['shingle'])} | {_fmt(r['ganesha'])} | "
            f"{_fmt(r['ratio'], 2)} | {goal} | {ss} / {gs} |"
        )
    L.append("")
    for name, fname in charts:
        L.append(f"![{name}]({fname})")
        L.append("")
    cpu = result.get("server_cpu_s") or {}
    if cpu:
        L.append("## Server CPU seconds per workload (median, from /proc of the server process)")
        L.append("")
        L.append(
            "Ganesha is multi-threaded C; shingle is one Python process. CPU seconds per unit of "
            "work show where shingle spends its time when the wall-clock ratio is low."
        )
        L.append("")
        L.append("| metric | shingle cpu s | Ganesha cpu s |")
        L.append("|---|---:|---:|")
        for metric, per in cpu.items():
            med = {k: (sorted(v)[len(v) // 2] if v else None) for k, v in per.items()}
            L.append(
                f"| {metric} | {_fmt(med.get('shingle'), 2)} | {_fmt(med.get('ganesha'), 2)} |"
            )
        L.append("")
    errors = result.get("errors") or []
    L.append("## Failures")
    L.append("")
    if not errors:
        L.append("None: every workload produced numbers on both servers.")
    else:
        L.append(
            "A workload that failed on a server is recorded here and left out of its medians "
            "(the harness goes on)."
        )
        L.append("")
        L.append("| server | client | workload | rep | error |")
        L.append("|---|---|---|---:|---|")
        for e in errors:
            L.append(
                f"| {e['server']} | {e['client']} | {e['workload']} | {e['rep']} | "
                f"{str(e['error']).replace('|', '/')} |"
            )
        tb = next((e.get("traceback") for e in errors if e.get("traceback")), None)
        if tb:
            L.append("")
            L.append("First traceback:")
            L.append("")
            L.append("```")
            L.append(tb.strip()[-1500:])
            L.append("```")
    L.append("")
    training = result.get("training")
    L.append("## Training workloads (nfs4fs through fsspec)")
    L.append("")
    if not training:
        L.append("Not run (--no-training).")
    elif "skipped" in training:
        L.append(f"Skipped: {training['skipped']}.")
    else:
        for name in ("shingle", "ganesha"):
            t = training.get(name) or {}
            if not t.get("ok"):
                L.append(f"- {name}: **failed**: {t.get('error')}")
                continue
            ck, ds = t.get("checkpoints", {}), t.get("dataset", {})
            L.append(
                f"- {name}: state dict {ck.get('model_MiB')} MiB; torch.save / safetensors / zarr "
                "each written as `.step-N.*.tmp`, committed, renamed to `step-N`; keep-last-2 by "
                f"{ck.get('prune_method')}: pruned {len(ck.get('pruned', []))} "
                f"({', '.join(ck.get('pruned', []))}), kept {ck.get('kept')}; every survivor "
                f"re-read and compared. DataLoader: {ds.get('workers')} workers, "
                f"{ds.get('corpus_MiB')} MiB of uint16 tokens, {ds.get('seq_len')}-token samples, "
                "token sum checked."
            )
    L.append("")
    profile = result.get("profile")
    if profile:
        L.append("## Where shingle spends its time (py-spy, attached to `shingle serve`)")
        L.append("")
        for wl, prof in profile.items():
            if "error" in prof:
                L.append(f"- {wl}: profile failed: {prof['error']}")
                continue
            L.append(
                f"### {wl} ({prof['samples']} "
                f"samples{', flamegraph ' + prof['svg'] if prof.get('svg') else ''})"
            )
            L.append("")
            L.append("| self % | function |")
            L.append("|---:|---|")
            for fn, pct in prof["top_self"][:12]:
                L.append(f"| {pct:.1f} | `{fn}` |")
            L.append("")
            L.append("| inclusive % | function |")
            L.append("|---:|---|")
            for fn, pct in prof["top_total"][:12]:
                L.append(f"| {pct:.1f} | `{fn}` |")
            L.append("")
    cluster = result.get("cluster")
    L.append("## Cluster-scale model (bench/cluster_model.py)")
    L.append("")
    if not cluster:
        L.append("Not run (--no-cluster).")
    else:
        pred, sim = cluster["prediction"], cluster["simulation"]
        L.append(
            "12 nodes x 8 drives x 16 TB, 8+2 across nodes, 25 GbE; placement by shingle's own "
            "`DataPath._place` (nodes, then drives within a node), per-drive cost by "
            "engine/drives/smr.py; "
            f"erasure coding {cluster['encode_note']}, {cluster['gateway_cores']} cores."
        )
        L.append("")
        L.append("| | aggregate read GB/s | 80 GB checkpoint write s | write bound by |")
        L.append("|---|---:|---:|---|")
        for name in ("gateway", "scale-out"):
            L.append(
                f"| model: {name} | {pred[name]['read_GBps']} | {pred[name]['ckpt80_write_s']} | "
                f"{pred[name]['write_bottleneck']} ({pred[name]['write_parts_s']}) |"
            )
        L.append(
            f"| model: drives only | {pred['drives_only']['read_GBps']} | "
            f"{pred['drives_only']['ckpt80_write_s']} "
            f"| SMR busy time of the busiest drive |"
        )
        lo, hi = cluster["measured"]["ckpt80_write_s"]
        L.append(
            f"| **measured (pilot)** | {cluster['measured']['read_GBps']} | {lo:.0f}-{hi:.0f} | |"
        )
        L.append("")
        L.append(
            f"Placement: {sim['stripes']} stripes; fragments per node "
            f"{min(sim['fragments_per_node'])}-"
            f"{max(sim['fragments_per_node'])}; write amplification "
            f"{sim['write_amplification']:.2f}; "
            f"sequential-append share {sim['sequential_append_share']:.3f}."
        )
        L.append("")
        for note in cluster["explanation"]:
            L.append(f"- {note}")
    L.append("")
    L.append("## Closing note")
    L.append("")
    L.extend(closing(result))
    L.append("")
    return "\n".join(L)


PROFILE_OF = {
    "seq_write_MBps": "nfsrs.seq_write",
    "ckpt8_write_MBps": "nfsrs.seq_write",
    "seq_read_cold_MBps": "nfsrs.seq_read",
    "seq_read_warm_MBps": "nfsrs.seq_read",
    "shard16_read_MBps": "nfsrs.seq_read",
    "create_per_s": "nfsrs.small_files",
    "stat_per_s": "nfsrs.small_files",
    "remove_per_s": "nfsrs.small_files",
    "randwrite_iops": "nfsrs.random_write",
}
# where the profile's time goes -> what would close the gap (matched on frame text)
REMEDIES = (
    (
        ("_write_to_self", "call_soon_threadsafe", "_selectorsockettransport.write"),
        "the hand-off of every reply from a worker thread to the asyncio loop (one self-pipe "
        "wakeup per request) and socket writes from Python: batch replies per wakeup, send them "
        "with sendmsg of memoryviews, or serve READ/WRITE from a thread that owns its socket",
    ),
    (
        ("_drive_writer", "zonefiledrive.sync", "fsync", "fdatasync", "_committer"),
        "durability on every stable WRITE/COMMIT (drive writers' writes and fsyncs of 10 zone "
        "files on one disk here): group-commit concurrent writers' stripes so one fsync round "
        "covers many WRITEs",
    ),
    (
        ("do_commit", "sqlite", "catalog", "sqlalchemy", "_sql ("),
        "catalog transactions on the request path: batch them (one transaction per "
        "COMMIT/compound, group "
        "commit across clients) and serve GETATTR/LOOKUP from the inode cache",
    ),
    (
        ("encode", "pyeclib", "erasure"),
        "erasure coding in the request thread: more encoder threads / larger batches",
    ),
    (
        ("xdr", "rpc", "compound", "pack", "unpack"),
        "Python XDR/RPC work per request: precompiled codecs, fewer copies",
    ),
    (
        ("_extent_map", "read_into", "_read_ahead", "crc32c"),
        "read path: larger read-ahead, cached extent maps, no re-checksum of cached stripes",
    ),
)


def remedy_for(frames: list[str]) -> str | None:
    """The remedy for the busiest frame that has one (frames in profile order)."""
    for f in frames:
        for keys, text in REMEDIES:
            if any(k in f.lower() for k in keys):
                return text
    return None


def closing(result: dict) -> list[str]:
    rows = result["rows"]
    out = []
    missed = [
        r for r in rows if r["goal"] is not None and (r["ratio"] is None or r["ratio"] < r["goal"])
    ]
    met = [
        r
        for r in rows
        if r["goal"] is not None and r["ratio"] is not None and r["ratio"] >= r["goal"]
    ]
    out.append(f"Goals met: {len(met)}; missed or failed: {len(missed)}.")
    if missed:
        out.append("")
        out.append(
            "Missed: "
            + ", ".join(f"{r['metric']} ({_fmt(r['ratio'], 2)} < {r['goal']})" for r in missed)
            + "."
        )
    profile = result.get("profile") or {}
    cpu = result.get("server_cpu_s") or {}
    if missed:
        out.append("")
        out.append(
            "Why, per missed metric (server CPU seconds of the workload, median, and the busiest "
            "frames of shingle's profile of that kind of workload):"
        )
        out.append("")
        for r in missed:
            base = r["metric"].split(".", 1)[-1]
            c = cpu.get(r["metric"], {})
            med = {k: (sorted(v)[len(v) // 2] if v else None) for k, v in c.items()}
            prof = profile.get(PROFILE_OF.get(base, ""), {})
            frames = [f for f, _p in prof.get("top_self", [])[:5]]
            why = (
                f"cpu s shingle {_fmt(med.get('shingle'), 2)} "
                f"vs Ganesha {_fmt(med.get('ganesha'), 2)}"
            )
            if frames:
                why += "; top self frames: " + ", ".join(
                    f"`{f}` {p:.0f}%" for f, p in prof["top_self"][:4]
                )
                fix = remedy_for(frames)
                if fix:
                    why += f". To close it: {fix}"
            elif r["ratio"] is None:
                why += "; shingle failed this workload (see Failures)"
            out.append(f"- {r['metric']} ({_fmt(r['ratio'], 2)}): {why}.")
    failed = {e["workload"] for e in result.get("errors") or [] if e["server"] == "shingle"}
    if failed:
        out.append("")
        out.append(
            "shingle failed these workloads (see Failures): " + ", ".join(sorted(failed)) + "."
        )
    notes = result.get("notes") or []
    if notes:
        out.append("")
        out.extend(f"- {n}" for n in notes)
    return out
