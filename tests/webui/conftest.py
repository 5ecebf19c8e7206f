"""Fixtures for the web UI: a catalog with emulated drives and an admin, the
Flask app, a signed-in client.

SMART comes from tests/fixtures/smart/fake_smartctl, which answers for /dev/sda
(ATA SMR), /dev/sdb (SAS) and /dev/nvme0 (NVMe) with real-shaped smartctl JSON."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from migrated import migrate_sqlite
from sqlalchemy import select

from appliance import config as config_mod
from engine.admin import accounts
from engine.catalog import Catalog
from engine.catalog.models import Drive, Zone

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "smart"
FAKE_SMARTCTL = FIXTURES / "fake_smartctl"
ADMIN, PASSWORD = "admin", "correct horse battery"
ZONE_SIZE = 1 << 20
DEVICES = {1: "/dev/sda", 2: "/dev/sdb", 3: "/dev/nvme0"}  # drive 4 stays emulated: no SMART
# Small stripes so that 4 emulated drives hold every class (2+2 EC, 3 copies).
BAND_CLASSES = {
    "hot": {"copies": 3, "fragment_size": "16KiB"},
    "warm": {"k": 2, "m": 2, "fragment_size": "16KiB"},
    "cold": {"k": 2, "m": 2, "fragment_size": "16KiB"},
}


def make_config(url: str, root: Path) -> config_mod.Config:
    return config_mod.from_dict(
        {
            "appliance": {"data_dir": str(root)},
            "catalog": {"url": url},
            "smart": {"smartctl": str(FAKE_SMARTCTL)},
            "band_classes": BAND_CLASSES,
        },
        root / "shingle.toml",
    )


def seed_zones(catalog: Catalog) -> None:
    """Give drive 1 a few written bands, as the data path leaves them, so the band map
    has something to draw."""
    zones = Zone.__table__

    def work(conn):
        ids = [
            r.id
            for r in conn.execute(
                select(zones.c.id).where(zones.c.drive_id == 1).order_by(zones.c.idx)
            )
        ]
        layout = [
            ("full", "warm", ZONE_SIZE, ZONE_SIZE, 0),
            ("full", "cold", ZONE_SIZE, ZONE_SIZE // 4, 3 * ZONE_SIZE // 4),
            ("open", "hot", ZONE_SIZE // 2, ZONE_SIZE // 2, 0),
            ("open", "warm", ZONE_SIZE // 3, ZONE_SIZE // 3, 0),
        ]
        for zone_id, (state, cls, wp, live, garbage) in zip(ids, layout, strict=False):
            conn.execute(
                zones.update()
                .where(zones.c.id == zone_id)
                .values(
                    state=state,
                    band_class=cls,
                    write_pointer=wp,
                    live_bytes=live,
                    garbage_bytes=garbage,
                )
            )

    catalog.run(work)


def make_appliance(url: str, root: Path, *, seed: bool = True):
    """Drives and the admin in a migrated catalog at ``url``; returns (config, open catalog).

    ``seed`` writes band states straight into the catalog for pages that only read it; an appliance
    whose daemon runs (``live``) gets real bands from real writes instead."""
    from engine.drives import format_emulated

    catalog = Catalog(url)
    format_emulated(catalog, root / "drives", 4, 16 * ZONE_SIZE, ZONE_SIZE)
    drives = Drive.__table__
    catalog.run(
        lambda conn: [
            conn.execute(drives.update().where(drives.c.id == i).values(device=d))
            for i, d in DEVICES.items()
        ]
    )
    if seed:
        seed_zones(catalog)
    accounts.create_admin(catalog, ADMIN, PASSWORD, actor="test")
    return make_config(url, root), catalog


@pytest.fixture(scope="session")
def template_catalog(tmp_path_factory) -> Path:
    """One migrated and populated SQLite catalog per run; each test gets a copy (migrating and
    formatting per test would dominate the run time). The drive folders stay in
    the template's folder."""
    root = tmp_path_factory.mktemp("webui-template")
    url = f"sqlite:///{root}/catalog.db"
    migrate_sqlite(url)
    _, catalog = make_appliance(url, root)
    catalog.close()  # the last connection closing checkpoints the WAL into catalog.db
    return root / "catalog.db"


@pytest.fixture
def appliance(template_catalog, tmp_path):
    import shutil

    shutil.copyfile(template_catalog, tmp_path / "catalog.db")
    url = f"sqlite:///{tmp_path}/catalog.db"
    config = make_config(url, tmp_path)
    catalog = Catalog(url)
    yield config, catalog
    catalog.close()


@pytest.fixture
def app(appliance):
    from webui.app import create_app

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
        return self.client.post(
            "/login", data={"username": username, "password": password, "csrf_token": self.csrf}
        )

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


class Live:
    """An appliance as it runs: the daemon's side (data path, namespace, maintenance loop running
    queued jobs) and the web UI's app on the same catalog, as two separate parts."""

    def __init__(self, url: str, root: Path):
        from appliance.daemonlock import DaemonLock
        from appliance.maintenance import Maintenance
        from appliance.runtime import Appliance
        from webui.app import create_app

        self.config, catalog = make_appliance(url, root, seed=False)
        catalog.close()
        self.lock = DaemonLock(
            self.config.data_dir
        )  # as `shingle serve` does: the web UI shows its pid
        assert self.lock.acquire()
        self.daemon = Appliance(self.config)
        self.catalog, self.namespace = self.daemon.catalog, self.daemon.namespace
        self.maintenance = Maintenance(self.daemon, tick_s=0.05)
        self.maintenance.start()
        self.app = create_app(self.config)
        self.app.config["TESTING"] = True

    def close(self):
        self.maintenance.stop()
        self.maintenance.join(30)
        self.app.extensions["shingle"].close()
        self.daemon.close()
        self.lock.release()


@pytest.fixture
def live(tmp_path):
    url = f"sqlite:///{tmp_path}/catalog.db"
    migrate_sqlite(url)
    appliance = Live(url, tmp_path)
    yield appliance
    appliance.close()


@pytest.fixture
def live_web(live):
    browser = Browserish(live.app.test_client())
    assert browser.login().status_code == 302
    return browser


CHROMIUM = "/usr/bin/chromium"  # Debian's: never `playwright install`
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="session")
def chromium():
    """One chromium for the run's browser tests: a launch costs 2-8 s, a context 0.3-2 s."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(chromium):
    """A tab in a context of this test's own: no cookie or storage of another test."""
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    try:
        tab = context.new_page()
        tab.set_default_timeout(15000)
        yield tab
    finally:
        context.close()
