"""Fixtures for the data path: emulated zoned drives (folders of zone files) and a DataPath."""
from __future__ import annotations

import pytest

from dphelpers import Engine


@pytest.fixture
def engine(catalog, tmp_path):
    eng = Engine(catalog, tmp_path / "drives")
    yield eng
    eng.close()
