"""NFSv4 clients in the API and on the exports page: the rows the NFS server writes (a client
record with its principal, a delegation's settings row, recalled or not) read back with the
principal as an admin reads it and the delegated file's path; any token may read them. The
page also shows each export's flavours."""

from __future__ import annotations

import json
import time

from sqlalchemy import select

from engine.admin import accounts, exports
from engine.catalog.models import NfsClient
from engine.namespace.common import ROOT_INO_KEY
from tests.webui.conftest import ADMIN


def record_client(catalog, clientid: int, owner: bytes, principal: list, minor: int = 1) -> None:
    """An NFSv4 client record as the NFS server writes it (appliance/nfs/state/records.py)."""
    now = time.time_ns()
    catalog.run(
        lambda conn: conn.execute(
            NfsClient.__table__.insert().values(
                head="",
                principal=json.dumps(principal),
                clientid=clientid,
                owner=owner,
                verifier=b"v" * 8,
                address="10.0.0.7",
                minor_version=minor,
                confirmed=True,
                reclaim_complete=True,
                held_state=True,
                created_ns=now,
                last_seen_ns=now,
            )
        )
    )


def test_clients_with_principals_and_delegations(app, appliance):
    _, catalog = appliance
    root = int(catalog.get_setting(ROOT_INO_KEY))
    record_client(catalog, 0xAB01, b"kerberos-host", [6, 1000, "alice@EXAMPLE.ORG"])
    record_client(catalog, 0xAB02, b"plain-host", [1, 0, ""], minor=0)
    deleg = {"head": "h:2049", "clientid": 0xAB01, "owner": b"kerberos-host".hex()}
    catalog.set_setting(
        f"nfs_delegation_{root}_{'00' * 12}",
        json.dumps({**deleg, "type": "write", "granted_ns": 5}),
    )
    catalog.set_setting(  # one the server recalled: a conflicting change waits for it
        f"nfs_delegation_{root}_{'01' * 12}",
        json.dumps({**deleg, "type": "read", "granted_ns": 6, "recalled_ns": 7}),
    )
    uid = catalog.read(lambda c: c.execute(select(accounts.USERS.c.id)).scalar())
    token = accounts.create_token(catalog, uid, "reader", scope="read-only", actor=ADMIN)
    client = app.test_client()
    response = client.get("/api/v1/nfs/clients", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.get_json()
    shown = {cl["clientid"]: cl for cl in response.get_json()}
    assert shown["ab01"]["principal"] == "krb5 alice@EXAMPLE.ORG (uid 1000)"
    common = {"inode": root, "path": "/", "clientid": "ab01"}
    assert sorted(shown["ab01"]["delegations"], key=lambda d: d["granted_ns"]) == [
        {**common, "type": "write", "granted_ns": 5, "recalled_ns": None},
        {**common, "type": "read", "granted_ns": 6, "recalled_ns": 7},
    ]
    assert shown["ab02"]["principal"] == "sys uid 0" and shown["ab02"]["version"] == "4.0"
    assert shown["ab02"]["delegations"] == []
    assert client.get("/api/v1/nfs/clients").status_code == 401


def test_exports_page_lists_them(web, appliance):
    _, catalog = appliance
    record_client(catalog, 0xCD01, b"kerberos-host", [6, 1000, "bob@EXAMPLE.ORG"])
    root = int(catalog.get_setting(ROOT_INO_KEY))
    catalog.set_setting(
        f"nfs_delegation_{root}_{'02' * 12}",
        json.dumps(
            {"head": "h", "clientid": 0xCD01, "owner": b"kerberos-host".hex(), "type": "read"}
            | {"granted_ns": 1, "recalled_ns": 2}
        ),
    )
    exports.create(catalog, {"name": "/kerberos", "path": "/", "sec": "krb5p:krb5"}, actor=ADMIN)
    web.login()
    page = web.get("/exports").get_data(as_text=True)
    assert "<td>krb5p, krb5</td>" in page  # the export's flavours, in its order
    assert 'id="nfs-client-table"' in page and "krb5 bob@EXAMPLE.ORG (uid 1000)" in page
    assert "read <code>/</code> <strong>recalled</strong>" in page
