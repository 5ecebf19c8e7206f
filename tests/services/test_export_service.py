"""engine.admin.exports on both catalogs: checks, changes with their events, the default export."""

from __future__ import annotations

import pytest

from engine.admin import events
from engine.admin import exports as export_service
from engine.base import errors
from engine.namespace import ROOT


def test_create_update_delete_with_events(catalog, namespace):
    namespace.mkdir(ROOT, namespace.root_ino, "data")
    made = export_service.create(
        catalog,
        {"name": "/data//sets/", "path": "/data/", "clients": "10.0.0.0/8, 192.168.1.5"},
        actor="alice",
        namespace=namespace,
    )
    assert (made.name, made.path) == ("/data/sets", "/data")
    assert made.clients == "10.0.0.0/8,192.168.1.5/32"
    assert (made.access, made.squash, made.anon_uid, made.trash_days, made.enabled) == (
        "rw",
        "root_squash",
        65534,
        7,
        True,
    )
    assert export_service.get(catalog, made.id) == made
    changed = export_service.update(
        catalog, made.id, {"squash": "no_root_squash", "access": "ro"}, actor="bob"
    )
    assert changed.squash == "no_root_squash" and changed.read_only
    assert changed.clients == made.clients
    assert [e.name for e in export_service.list_exports(catalog)] == ["/data/sets"]
    export_service.update(catalog, made.id, {"enabled": False}, actor="bob")
    assert export_service.list_exports(catalog, enabled_only=True) == []
    export_service.delete(catalog, made.id, actor="carol")
    with pytest.raises(errors.NotFound, match=f"no export with id {made.id}"):
        export_service.get(catalog, made.id)
    log = events.recent(catalog, 10, kind_prefix="export.")
    assert [(e.kind, e.actor) for e in log] == [
        ("export.delete", "carol"),
        ("export.update", "bob"),
        ("export.update", "bob"),
        ("export.create", "alice"),
    ]
    assert log[-1].details["clients"] == "10.0.0.0/8,192.168.1.5/32"
    assert log[2].message == f"export {made.id} changed: access=ro, squash=no_root_squash"


@pytest.mark.parametrize(
    "values, field, expected",
    [
        ({"name": "export"}, "name", "the path clients mount"),
        ({"name": "/a/../b"}, "name", "no '.' or '..' components"),
        ({"name": "/a", "clients": "10.0.0.300/8"}, "clients", "an IP address or CIDR"),
        ({"name": "/a", "clients": " , "}, "clients", "at least one client"),
        ({"name": "/a", "clients": ",".join(["10.0.0.1"] * 65)}, "clients", "at most 64 entries"),
        (
            {"name": "/a", "squash": "everyone"},
            "squash",
            "one of root_squash, all_squash, no_root_squash",
        ),
        ({"name": "/a", "access": "rx"}, "access", "one of rw, ro"),
        ({"name": "/a", "anon_uid": -1}, "anon_uid", "a whole number 0-4294967295"),
        ({"name": "/a", "trash_days": "7"}, "trash_days", "a whole number 0-3650"),
        ({"name": "/a", "enabled": "yes"}, "enabled", "true or false"),
        ({"name": "/a", "path": "relative"}, "path", "an absolute path"),
        ({"name": "/a", "path": "/missing"}, "path", "an existing directory in the namespace"),
        ({"name": "/a", "colour": "red"}, "colour", "a field of an export"),
        ({"path": "/"}, "name", "the path clients mount"),
    ],
)
def test_bad_values_name_field_value_and_expected(catalog, namespace, values, field, expected):
    with pytest.raises(export_service.ExportValueError) as caught:
        export_service.create(catalog, values, actor="t", namespace=namespace)
    exc = caught.value
    assert exc.field == field and expected in exc.expected
    assert str(exc).startswith(f"{field} = ") and f"expected {exc.expected}" in str(exc)
    assert isinstance(exc, errors.InvalidArgument) and isinstance(exc, ValueError)
    assert export_service.list_exports(catalog) == []  # nothing was written


def test_a_file_is_not_a_directory_to_export(catalog, namespace):
    namespace.create(ROOT, namespace.root_ino, "file")
    with pytest.raises(
        export_service.ExportValueError, match="path = '/file': expected a directory"
    ):
        export_service.create(
            catalog, {"name": "/f", "path": "/file"}, actor="t", namespace=namespace
        )


def test_names_are_unique_and_updates_need_a_field(catalog):
    first = export_service.create(catalog, {"name": "/a"}, actor="t")
    second = export_service.create(catalog, {"name": "/b"}, actor="t")
    with pytest.raises(errors.Exists, match="export '/a' exists"):
        export_service.create(catalog, {"name": "/a/"}, actor="t")
    with pytest.raises(errors.Exists, match="export '/a' exists"):
        export_service.update(catalog, second.id, {"name": "/a"}, actor="t")
    with pytest.raises(export_service.ExportValueError, match="expected some of name"):
        export_service.update(catalog, first.id, {}, actor="t")
    with pytest.raises(errors.NotFound):
        export_service.update(catalog, 999, {"squash": "all_squash"}, actor="t")
    with pytest.raises(errors.NotFound):
        export_service.delete(catalog, 999, actor="t")


def test_default_export_only_into_an_empty_table(catalog):
    export_service.ensure_default(catalog)
    export_service.ensure_default(catalog, "/other")
    (only,) = export_service.list_exports(catalog)
    assert (only.name, only.path, only.clients, only.squash) == (
        "/export",
        "/",
        "0.0.0.0/0,::/0",
        "root_squash",
    )
