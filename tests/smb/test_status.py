"""smbd's status from outside the daemon, with a real `shingle serve --smb-port`: `shingle
status`, the web UI's API and page, and /metrics (each its own process or app, as in production:
smbstatus over the daemon's smb.conf) show a session while an smbprotocol client is connected."""

from __future__ import annotations

import json

from appliance import config as config_mod
from engine.admin import accounts
from tests.smb.conftest import PASSWORDS, shingle


def _status(served) -> dict:
    return json.loads(shingle(served.config, "status", "--json").stdout)["smb"]


def _web(served):
    from appliance.runtime import open_catalog
    from webui.app import create_app

    config = config_mod.load(served.config)
    catalog = open_catalog(config)
    try:
        uid = accounts.create_admin(catalog, "smbadmin", "a long test password", actor="test")
        token = accounts.create_token(catalog, uid, "status", scope="read-only")
    finally:
        catalog.close()
    app = create_app(config)
    return app, {"Authorization": f"Bearer {token}"}


def test_a_connected_client_shows_as_a_session_everywhere(served):
    import smbclient

    # the appliance is shared with the folder's other tests: a session of alice's that one of
    # them closed may still be listed for a moment
    served.wait_for(
        lambda: not any(s["user"] == "alice" for s in _status(served)["sessions"]),
        20,
        "no session of alice's before the test",
    )
    before = _status(served)
    assert before["enabled"] and before["running"] and before["error"] is None, before
    assert before["port"] == served.smb_port and before["shares"] >= 1
    assert before["users"] == len(PASSWORDS)
    assert not [s for s in before["sessions"] if s["user"] == "alice"]

    app, reader = _web(served)
    client = app.test_client()
    try:
        smbclient.register_session(
            "127.0.0.1",
            username="alice",
            password=PASSWORDS["alice"],
            port=served.smb_port,
            encrypt=False,
        )
        try:
            served.wait_for(
                lambda: any(s["user"] == "alice" for s in _status(served)["sessions"]),
                20,
                "alice's session in shingle status",
            )
            text = shingle(served.config, "status").stdout
            line = next(x for x in text.splitlines() if x.startswith("smb "))
            assert f"smbd running (pid {before['pid']}, port {served.smb_port})" in line
            assert "alice@" in line, line

            api = client.get("/api/v1/smb/status", headers=reader)
            assert api.status_code == 200, api.get_data(as_text=True)
            sessions = api.get_json()["sessions"]
            assert any(s["user"] == "alice" and s["protocol"] for s in sessions), sessions
            metrics = client.get("/metrics").get_data(as_text=True)
            assert "shingle_smb_up 1" in metrics
            count = next(
                int(x.split()[1])
                for x in metrics.splitlines()
                if x.startswith("shingle_smb_sessions ")
            )
            assert count >= 1
        finally:
            smbclient.reset_connection_cache()
        served.wait_for(
            lambda: not any(s["user"] == "alice" for s in _status(served)["sessions"]),
            20,
            "alice's session to end",
        )
    finally:
        app.extensions["shingle"].close()
