"""Fixtures for the data path: emulated zoned drives (folders of zone files) and a DataPath.

``engine`` runs on SQLite and PostgreSQL (catalog behaviour matters); ``sqlite_engine`` is for
behaviour of drives, codes and reads, where a second database only costs time."""

from __future__ import annotations

import pytest
from dphelpers import Engine


@pytest.fixture
def engine(catalog, tmp_path):
    eng = Engine(catalog, tmp_path / "drives")
    yield eng
    eng.close()


@pytest.fixture
def sqlite_engine(sqlite_catalog, tmp_path):
    eng = Engine(sqlite_catalog, tmp_path / "drives")
    yield eng
    eng.close()
