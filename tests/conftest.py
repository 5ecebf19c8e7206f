"""Fixtures shared by every test folder.

- ``postgres_server``: a real PostgreSQL 15 started for this test run
  (initdb as the postgres user, socket and data in a temp folder).
- ``catalog_url``: parametrized over SQLite and PostgreSQL; each test gets a
  fresh, migrated, empty database (a copy of one migrated per run: tests/migrated.py).
- ``catalog`` / ``namespace``: opened on that URL; ``sqlite_catalog``: SQLite only.
- ``count_reads(catalog)``: a list that grows by one per ``catalog.read`` from then on
  (for tests that a call was served from a cache).
- every test's emulated drive folders (``drives/`` under its tmp_path) are
  removed when it ends: zone files are preallocated, and pytest keeps the
  last three runs' folders (21 GB per run before this).
- the engine's locks check their order (engine/base/ordered_lock.py) in every test and in the
  processes tests start: a lock taken out of RANKS order raises LockOrderError.
- the repository's Python files are byte-compiled once when the run starts (see
  pytest_sessionstart).
"""

from __future__ import annotations

import compileall
import os
import shutil
from pathlib import Path

os.environ.setdefault("SHINGLE_CHECK_LOCK_ORDER", "1")  # before any engine lock is made

import pytest
from migrated import migrate_sqlite
from pgserver import PG_BIN, PostgresServer, free_port  # noqa: F401  (free_port is for test modules)

from engine.base import ordered_lock  # noqa: E402
from engine.catalog import Catalog
from engine.namespace import Namespace

ordered_lock.enable(os.environ["SHINGLE_CHECK_LOCK_ORDER"] not in ("", "0"))

REPO = Path(__file__).resolve().parents[1]


def pytest_sessionstart(session) -> None:
    """Write the __pycache__ files of the repository's code before the tests run. Under
    PYTHONDONTWRITEBYTECODE (set where the suite runs) no Python process writes them, so each
    `python -m appliance.cli ...`, `shingle serve` and helper process the tests start compiled
    the ~120 modules of ours it imports from source: 0.19 s of the 0.85 s of CPU of a `shingle
    snapshot list`. Python still reads them then; a source changed later is compiled again in
    memory as before (each file records its source's mtime and size)."""
    for top in ("appliance", "engine", "webui", "migrations", "bench", "tests"):
        compileall.compile_dir(REPO / top, quiet=2)


@pytest.fixture(autouse=True)
def _remove_drive_folders(request):
    base = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    yield  # set up first, so this runs after the test's own fixtures stopped their servers
    if base is not None:
        for folder in [p for p in base.rglob("drives") if p.is_dir()]:
            shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def count_reads(monkeypatch):
    def wrap(catalog) -> list:
        calls = []
        original = catalog.read

        def read(work):
            calls.append(1)
            return original(work)

        monkeypatch.setattr(catalog, "read", read)
        return calls

    return wrap


@pytest.fixture
def pg():
    """A PostgreSQL of this test's own, for tests that stop it (a catalog outage)."""
    if not (PG_BIN / "postgres").exists():
        pytest.skip("PostgreSQL 15 is not installed")
    server = PostgresServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def postgres_server():
    server = PostgresServer().start()
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def catalog_url(request, tmp_path):
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/catalog.db"
        migrate_sqlite(url)
        return url
    return request.getfixturevalue("postgres_server").create_migrated_database()


@pytest.fixture
def sqlite_catalog(tmp_path):
    """SQLite only: for behaviour of drives, codes and jobs, where a second
    database only costs time."""
    url = f"sqlite:///{tmp_path}/catalog.db"
    migrate_sqlite(url)
    cat = Catalog(url)
    yield cat
    cat.close()


@pytest.fixture
def catalog(catalog_url):
    cat = Catalog(catalog_url)
    yield cat
    cat.close()


@pytest.fixture
def namespace(catalog):
    return Namespace(catalog)
