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


@pytest.fixture(params=["native", "python"])
def drive_writers(request, monkeypatch):
    """Runs a test with each implementation of the drives' writer threads: the compiled one
    (engine/native/drivewriters.pyx, where it is built) and the pure-Python fallback."""
    from engine.datapath import writers
    from engine.native import driveio

    if request.param == "native":
        if driveio is None:
            pytest.fail("engine.native.drivewriters is not built: run `pip install -e .`")
    else:
        monkeypatch.setattr(writers, "driveio", None)
    return request.param
