"""Fixtures shared by every test folder.

- ``postgres_server``: a real PostgreSQL 15 started for this test run
  (initdb as the postgres user, socket and data in a temp folder).
- ``catalog_url``: parametrized over SQLite and PostgreSQL; each test gets a
  fresh, migrated, empty database.
- ``catalog`` / ``namespace``: opened on that URL; ``sqlite_catalog``: SQLite only.
"""
from __future__ import annotations

import pytest

from engine.catalog import Catalog, upgrade
from engine.namespace import Namespace
from pgserver import PostgresServer, free_port  # noqa: F401  (free_port is for test modules)


@pytest.fixture(scope="session")
def postgres_server():
    server = PostgresServer().start()
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def catalog_url(request, tmp_path):
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/catalog.db"
    else:
        url = request.getfixturevalue("postgres_server").create_database()
    upgrade(url)
    return url


@pytest.fixture
def sqlite_catalog(tmp_path):
    """SQLite only: for behaviour of drives, codes and jobs, where a second database only costs time."""
    url = f"sqlite:///{tmp_path}/catalog.db"
    upgrade(url)
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
