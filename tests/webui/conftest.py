"""Fixtures for the web UI: a catalog with emulated drives and an admin, the Flask app, a signed-in client.

SMART comes from tests/fixtures/smart/fake_smartctl, which answers for /dev/sda
(ATA SMR), /dev/sdb (SAS) and /dev/nvme0 (NVMe) with real-shaped smartctl JSON."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlalchemy import select

from appliance import config as config_mod
from engine import accounts
from engine.catalog import Catalog, upgrade
from engine.catalog.models import Drive, Zone

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "smart"
FAKE_SMARTCTL = FIXTURES / "fake_smartctl"
ADMIN, PASSWORD = "admin", "correct horse battery"
ZONE_SIZE = 1 << 20
DEVICES = {1: "/dev/sda", 2: "/dev/sdb", 3: "/dev/nvme0"}  # drive 4 stays emulated: no SMART


def seed_zones(catalog: Catalog) -> None:
    """Give drive 1 a few written bands, as the data path leaves them, so the band map has something to draw."""
    zones = Zone.__table__

    def work(conn):
        ids = [r.id for r in conn.execute(select(zones.c.id).where(zones.c.drive_id == 1).order_by(zones.c.idx))]
        layout = [("full", "warm", ZONE_SIZE, ZONE_SIZE, 0), ("full", "cold", ZONE_SIZE, ZONE_SIZE // 4,
                  3 * ZONE_SIZE // 4), ("open", "hot", ZONE_SIZE // 2, ZONE_SIZE // 2, 0),
                  ("open", "warm", ZONE_SIZE // 3, ZONE_SIZE // 3, 0)]
        for zone_id, (state, cls, wp, live, garbage) in zip(ids, layout):
            conn.execute(zones.update().where(zones.c.id == zone_id).values(
                state=state, band_class=cls, write_pointer=wp, live_bytes=live, garbage_bytes=garbage))
    catalog.run(work)


def make_appliance(url: str, root: Path):
    """Drives, zones and the admin in a migrated catalog at ``url``; returns (config, open catalog)."""
    from engine.drives import format_emulated
    catalog = Catalog(url)
    format_emulated(catalog, root / "drives", 4, 16 * ZONE_SIZE, ZONE_SIZE)
    drives = Drive.__table__
    catalog.run(lambda conn: [conn.execute(drives.update().where(drives.c.id == i).values(device=d))
                              for i, d in DEVICES.items()])
    seed_zones(catalog)
    accounts.create_admin(catalog, ADMIN, PASSWORD, actor="test")
    config = config_mod.from_dict({"appliance": {"data_dir": str(root)}, "catalog": {"url": url},
                                   "smart": {"smartctl": str(FAKE_SMARTCTL)}}, root / "shingle.toml")
    return config, catalog


@pytest.fixture(scope="session")
def template_catalog(tmp_path_factory) -> Path:
    """One migrated and populated SQLite catalog per run; each test gets a copy (migrating and
    formatting per test would dominate the run time). The drive folders stay in the template's folder."""
    root = tmp_path_factory.mktemp("webui-template")
    url = f"sqlite:///{root}/catalog.db"
    upgrade(url)
    _, catalog = make_appliance(url, root)
    catalog.close()  # the last connection closing checkpoints the WAL into catalog.db
    return root / "catalog.db"


@pytest.fixture
def appliance(template_catalog, tmp_path):
    import shutil
    shutil.copyfile(template_catalog, tmp_path / "catalog.db")
    url = f"sqlite:///{tmp_path}/catalog.db"
    config = config_mod.from_dict({"appliance": {"data_dir": str(tmp_path)}, "catalog": {"url": url},
                                   "smart": {"smartctl": str(FAKE_SMARTCTL)}}, tmp_path / "shingle.toml")
    catalog = Catalog(url)
    yield config, catalog
    catalog.close()


@pytest.fixture
def app(appliance):
    from webui import auth
    from webui.app import create_app
    auth._ip_failures.clear()
    application = create_app(appliance[0])
    application.config["TESTING"] = True
    yield application
    application.extensions["shingle"].close()


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert match, "page has no CSRF token field"
    return match.group(1)


class Browserish:
    """A Flask test client that signs in and carries the CSRF token like a browser form would."""

    def __init__(self, client):
        self.client = client
        self.csrf = None

    def login(self, username=ADMIN, password=PASSWORD):
        self.csrf = csrf_of(self.client.get("/login").get_data(as_text=True))
        return self.client.post("/login", data={"username": username, "password": password,
                                                "csrf_token": self.csrf})

    def get(self, *args, **kwargs):
        return self.client.get(*args, **kwargs)

    def post(self, url, data=None, **kwargs):
        data = dict(data or {})
        data.setdefault("csrf_token", self.csrf)
        return self.client.post(url, data=data, **kwargs)

    def api(self, method, url, json=None, **kwargs):
        headers = kwargs.pop("headers", {})
        headers.setdefault("X-CSRF-Token", self.csrf)
        return self.client.open(url, method=method, json=json, headers=headers, **kwargs)


@pytest.fixture
def web(app):
    browser = Browserish(app.test_client())
    response = browser.login()
    assert response.status_code == 302, response.get_data(as_text=True)
    return browser
