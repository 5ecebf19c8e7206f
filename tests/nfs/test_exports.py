"""Export rules: the default export, CIDR checks, squashing, bad rows."""

from __future__ import annotations

import pytest
from nfs4_support import add_export
from sqlalchemy import select

from appliance.nfs.exports import ExportTable, ensure_default_export, parse_networks
from engine.catalog.models import Export
from engine.namespace import Cred


def test_ensure_default_export_once(stack):
    ensure_default_export(stack.catalog)
    ensure_default_export(stack.catalog)
    rows = stack.catalog.read(lambda conn: conn.execute(select(Export.__table__)).all())
    assert len(rows) == 1
    row = rows[0]
    assert (row.name, row.path, row.access, row.squash) == ("/export", "/", "rw", "root_squash")


def test_rules_cidr_and_squash(stack):
    add_export(stack.catalog, name="/a", clients="127.0.0.1/32,10.0.0.0/8", squash="root_squash")
    add_export(
        stack.catalog,
        name="/deep/b",
        clients="::1/128",
        squash="all_squash",
        anon_uid=7,
        anon_gid=8,
    )
    add_export(stack.catalog, name="/broken", clients="not-an-address")
    table = ExportTable(stack.catalog, stack.namespace)
    rules = {r.name: r for r in table.by_id.values()}
    assert set(rules) == {"/a", "/deep/b"}  # the bad row is skipped (and logged), not fatal
    a, b = rules["/a"], rules["/deep/b"]
    assert a.allows("127.0.0.1") and a.allows("10.1.2.3") and not a.allows("127.0.0.2")
    assert a.allows("::ffff:127.0.0.1") and not a.allows("garbage")
    assert b.allows("::1") and not b.allows("127.0.0.1")
    assert a.cred(0, 0, ()).uid == 65534 and a.cred(1000, 100, (5,)).uid == 1000
    # root_squash maps the root group wherever it appears, the supplementary groups too
    assert a.cred(1000, 0, (0, 5)) == Cred(1000, 65534, (65534, 5))
    assert (b.cred(1000, 100, ()).uid, b.cred(1000, 100, ()).gid) == (7, 8)
    assert set(table.root.children) == {"a", "deep"}
    assert set(table.visible(table.root, "::1")) == {"deep"}
    with pytest.raises(ValueError, match="expected an address or CIDR"):
        parse_networks("10.0.0.0/99")


def test_refresh_takes_in_changes_made_through_the_service(stack):
    """How the daemon picks up a change from the web UI or `shingle exports set`: its periodic
    refresh reads the exports through engine.admin.exports again."""
    from engine.admin import exports as export_service

    ensure_default_export(stack.catalog)
    table = ExportTable(stack.catalog, stack.namespace)
    (rule,) = table.by_id.values()
    assert rule.squash == "root_squash" and rule.cred(0, 0, ()).uid == 65534
    export_service.update(stack.catalog, rule.id, {"squash": "no_root_squash"}, actor="t")
    table.refresh()
    assert (
        table.by_id[rule.id].squash == "no_root_squash"
        and table.by_id[rule.id].cred(0, 0, ()).uid == 0
    )
