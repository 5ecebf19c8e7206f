"""The cluster's maintenance leader in the web UI's dashboard, the REST API's /status, /metrics
and `shingle status`'s line, with a real etcd electing it; nothing of it on a single host."""

from __future__ import annotations

import html
import re

import pytest
from etcdserver import EtcdCluster, etcd_installed

from appliance import config as config_mod
from appliance.maintenance import maintenance_leader
from appliance.status import leader_line, leader_report
from tests.webui.conftest import BAND_CLASSES, FAKE_SMARTCTL, Browserish


def test_a_single_host_shows_no_leader(app, web, appliance):
    config, catalog = appliance
    assert leader_report(catalog, config) is None and leader_line(None) is None
    assert "shingle_leader_token" not in app.test_client().get("/metrics").get_data(as_text=True)
    assert 'id="cluster-leader"' not in web.get("/").get_data(as_text=True)
    assert web.api("GET", "/api/v1/status").get_json()["leader"] is None


@pytest.mark.skipif(not etcd_installed(), reason="etcd-server is not installed")
def test_the_leader_shows_in_status_metrics_and_dashboard(appliance, tmp_path):
    from webui.app import create_app

    _, catalog = appliance
    with EtcdCluster(1) as etcd:
        config = config_mod.from_dict(
            {
                "appliance": {"data_dir": str(tmp_path)},
                "catalog": {"url": catalog.url},
                "smart": {"smartctl": str(FAKE_SMARTCTL)},
                "band_classes": BAND_CLASSES,
                "cluster": {"etcd_endpoints": etcd.endpoints[0], "name": "rack1-node3"},
            },
            tmp_path / "shingle.toml",
        )
        report = leader_report(catalog, config)
        assert report is not None and report["holder"] is None and report["etcd_holder"] is None
        assert leader_line(report) == "no host has taken office yet"

        leader = maintenance_leader(config, catalog)
        assert leader is not None
        leader.start()
        try:
            token = leader.wait_elected(10)
            assert token is not None
            report = leader_report(catalog, config)
            assert report is not None
            assert (report["holder"], report["token"], report["etcd_holder"]) == (
                "rack1-node3",
                token,
                "rack1-node3",
            )
            assert leader_line(report) == f"rack1-node3 (token {token})"

            app = create_app(config)
            app.config["TESTING"] = True
            try:
                metrics = app.test_client().get("/metrics").get_data(as_text=True)
                assert f'shingle_leader_token{{holder="rack1-node3"}} {token}' in metrics
                web = Browserish(app.test_client())
                assert web.login().status_code == 302
                status = web.api("GET", "/api/v1/status").get_json()
                assert status["leader"]["holder"] == "rack1-node3"
                assert status["leader"]["token"] == token
                assert status["leader"]["etcd_holder"] == "rack1-node3"
                page = web.get("/").get_data(as_text=True)
                card = re.search(r'id="cluster-leader">(.*?)</section>', page, re.S)
                assert card is not None
                text = html.unescape(re.sub(r"\s+", " ", card.group(1)))
                assert f"rack1-node3</b> (token {token}" in text
                assert "vacant" not in text

                leader.stop(resign=True)
                page = web.get("/").get_data(as_text=True)
                assert "office vacant now" in page  # the fence still names the last leader
                assert leader_line(leader_report(catalog, config)) == (
                    f"rack1-node3 (token {token}); office vacant now"
                )
                etcd.kill(0)
                line = leader_line(leader_report(catalog, config))
                assert line is not None and "etcd did not answer" in line
            finally:
                app.extensions["shingle"].close()
        finally:
            leader.stop(resign=False)
