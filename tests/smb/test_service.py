"""engine.admin.smb on both catalogs, with Samba's real passdb (smbpasswd/pdbedit need no smbd)."""

from __future__ import annotations

import pytest

from appliance.smb.samba import SambaLayout, SambaPassdb, render_conf
from engine.admin import smb as smb_service
from engine.base import errors


def test_shares_and_users_are_checked_changed_and_rendered(catalog, namespace, tmp_path):
    passdb = SambaPassdb(SambaLayout(tmp_path / "smb"), catalog)
    with pytest.raises(smb_service.SmbValueError, match="name"):
        smb_service.create_share(catalog, {"name": "bad/name"}, actor="t")
    with pytest.raises(smb_service.SmbValueError, match="clients"):
        smb_service.create_share(catalog, {"name": "x", "clients": "nope"}, actor="t")
    with pytest.raises(smb_service.SmbValueError, match="path"):
        smb_service.create_share(
            catalog, {"name": "x", "path": "/missing"}, actor="t", namespace=namespace
        )
    share = smb_service.create_share(
        catalog, {"name": "data", "clients": "10.0.0.0/8", "read_only_users": "bob, bob"}, actor="t"
    )
    assert share.read_only_users == "bob" and not share.read_only
    with pytest.raises(errors.Exists):
        smb_service.create_share(catalog, {"name": "DATA"}, actor="t")
    share = smb_service.update_share(catalog, "data", {"access": "ro"}, actor="t")
    assert share.read_only
    alice = smb_service.create_user(catalog, "alice", "pw1", passdb=passdb, actor="t")
    bob = smb_service.create_user(catalog, "bob", "pw2", passdb=passdb, actor="t", uid=1000)
    assert (alice.uid, alice.gid, bob.uid, bob.gid) == (20000, 20000, 1000, 1000)
    assert passdb.names() == ["alice", "bob"]
    with pytest.raises(errors.Exists):
        smb_service.create_user(catalog, "alice", "x", passdb=passdb, actor="t")
    conf = render_conf(
        passdb.layout,
        smb_service.list_shares(catalog),
        mount=tmp_path / "m",
        host="127.0.0.1",
        port=4450,
    )
    assert "[data]" in conf and "hosts allow = 10.0.0.0/8" in conf and "read list = bob" in conf
    assert "read only = yes" in conf and "smb ports = 4450" in conf
    smb_service.delete_user(catalog, "bob", passdb=passdb, actor="t")
    assert passdb.names() == ["alice"] and [u.name for u in smb_service.list_users(catalog)] == [
        "alice"
    ]
    smb_service.delete_share(catalog, share.id, actor="t")
    assert smb_service.list_shares(catalog) == []


def test_a_new_users_password_survives_the_daemon_rewriting_the_nss_files(catalog, tmp_path):
    """The daemon's refresh round writes the nss files from committed rows only, so it drops a
    user whose row is still being added; pdbedit must find that user all the same (in CI, bob's
    `shingle smb user add` failed once when the round ran between the two)."""
    import threading

    from appliance.smb.samba import write_nss

    passdb = SambaPassdb(SambaLayout(tmp_path / "smb"), catalog)
    stop = threading.Event()

    def daemon_round():
        while not stop.is_set():
            write_nss(passdb.layout, smb_service.list_users(catalog))

    rewriter = threading.Thread(target=daemon_round)
    rewriter.start()
    try:
        names = [f"user{i}" for i in range(8)]
        for name in names:
            smb_service.create_user(catalog, name, "pw-" + name, passdb=passdb, actor="t")
    finally:
        stop.set()
        rewriter.join()
    assert passdb.names() == sorted(names)
    assert not list(passdb.layout.dir("nss").glob("*.pdbedit"))  # the private copies are gone
