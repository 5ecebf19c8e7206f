"""The compression ratio of cold data on the tiers page, in the tiers API and in /metrics,
after real tiering on a running appliance."""

from __future__ import annotations

import json
import random
import re

from engine.admin import metrics
from engine.lifecycle.tiering import Tiering, TieringPolicy
from engine.namespace import ROOT
from tests.webui.test_metrics import parse

KiB = 1 << 10


def tier_to_cold(live) -> dict[str, bytes]:
    """A JSON log (compresses) and a token shard (random: stored raw), tiered to cold."""
    ns = live.namespace
    logs = "".join(
        json.dumps({"step": i, "loss": round(2.5 - i * 1e-4, 4)}) + "\n" for i in range(6000)
    ).encode()
    tokens = random.Random(1).randbytes(96 * KiB)
    files = {"run.jsonl": logs, "tokens.bin": tokens}
    for name, data in files.items():
        made = ns.create(ROOT, ns.root_ino, name)
        ns.write(made.ino, 0, data)
        ns.commit(made.ino)
    tiering = Tiering(
        ns,
        live.daemon.datapath,
        live.catalog,
        TieringPolicy(hot_to_warm_after_s=0, warm_to_cold_after_s=0),
    )
    for _round in range(3):  # each file's hot tail goes warm first, then all of it cold
        if not tiering.run().files_moved:
            break
    return files


def test_tiers_page_api_and_metrics_show_the_cold_compression_ratio(live_web, live):
    files = tier_to_cold(live)
    html = live_web.get("/tiers").get_data(as_text=True)
    cold_row = next(r for r in html.split("<tr>") if "</span> cold</td>" in r)
    assert "zstd (level 3)" in cold_row
    ratio, compressed, total = re.search(
        r'class="compression-ratio"[^>]*>(\d+\.\d\d):1 <span class="help">\((\d+)/(\d+) stripes',
        cold_row,
    ).groups()
    # the log shrinks a lot, the token shard stays raw: the ratio is between
    assert 1.5 < float(ratio) < 20 and 0 < int(compressed) < int(total)
    warm_row = next(r for r in html.split("<tr>") if "</span> warm</td>" in r)
    assert 'class="compression-ratio"' in warm_row and "stripes)" not in warm_row  # none left

    classes = live_web.api("GET", "/api/v1/tiers").get_json()["band_classes"]
    cold = next(c for c in classes if c["name"] == "cold")
    assert f"{cold['compression_ratio']:.2f}" == ratio
    assert (cold["stripes_compressed"], cold["stripes"]) == (int(compressed), int(total))

    # the daemon's samples: a read of the cold log decompresses its stripes
    ns = live.namespace
    attr = ns.lookup(ROOT, ns.root_ino, "run.jsonl")
    assert ns.read(attr.ino, 0, attr.size) == files["run.jsonl"]
    metrics.record_sample(live.catalog, **live.daemon.datapath.counters())
    values = parse(live_web.get("/metrics").get_data(as_text=True))
    cold_ratio = values['shingle_compression_ratio{class="cold"}']
    assert f"{cold_ratio:.2f}" == ratio
    assert 'shingle_compression_ratio{class="warm"}' not in values  # no warm stripes left
    assert values['shingle_stripes_compressed{class="cold"}'] == int(compressed)
    assert (
        values['shingle_stripe_data_bytes{class="cold"}']
        / values['shingle_stripe_stored_bytes{class="cold"}']
        == cold_ratio
    )
    assert values["shingle_stripes_decompressed_total"] >= int(compressed)
    assert values["shingle_decompressed_bytes_total"] >= len(files["run.jsonl"])
