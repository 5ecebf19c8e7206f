"""Band cleaning under shared extents: a stripe shared by a file and its clones moves once."""

from __future__ import annotations

from sqlalchemy import func, select

from engine.admin import fsck
from engine.catalog.models import Stripe
from engine.lifecycle.cleaning import Cleaner, pick_victims
from engine.namespace import ROOT

from .conftest import KiB, check_accounting, sha
from .test_cleaning import delete, fill


def _stripes(catalog) -> int:
    table = Stripe.__table__
    return catalog.read(lambda c: c.execute(select(func.count()).select_from(table)).scalar())


def test_cleaning_moves_a_shared_stripe_once_and_every_reference_follows(rig):
    files = fill(rig, "a", 24, 128 * KiB)
    doomed = sorted(files)[::2]
    kept = {}
    folder = rig.ns.resolve("/a").ino
    for path in sorted(files)[1::2]:
        source = rig.ns.resolve(path)
        clone = rig.ns.create(ROOT, folder, path.rsplit("/", 1)[1] + ".clone")
        rig.ns.clone_range(ROOT, source.ino, 0, clone.ino, 0, 0)
        kept[path] = kept[path + ".clone"] = files[path]
    delete(rig, doomed)
    assert pick_victims(rig.catalog), "half-dead full zones to clean"
    stripes = _stripes(rig.catalog)
    report = Cleaner(rig.data, rig.catalog).run()
    assert report.zones_cleaned >= 1 and report.fragments_copied > 0
    assert _stripes(rig.catalog) == stripes, "fragments move; stripes and their sharing stay"
    check_accounting(rig.catalog)
    assert fsck.check(rig.catalog, rig.ns.root_ino).clean
    for path, data in kept.items():
        assert sha(rig.read_file(path)) == sha(data), path
    rig.restart()
    for path, data in kept.items():
        assert sha(rig.read_file(path)) == sha(data), path
