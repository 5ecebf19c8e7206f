"""A new, migrated SQLite catalog without running the migrations again.

Running every Alembic revision costs 0.7-2.5 s on the test machines, and hundreds of tests
each want an empty catalog at head. The migrations write the same schema and rows every time
(no random values), so the first call in a test process migrates a template and later calls
copy it: the same file ``upgrade(url)`` would leave. Tests of the migrations themselves call
``engine.catalog.upgrade``."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

from sqlalchemy import make_url

from engine.catalog import upgrade

_template: Path | None = None


def _template_file() -> Path:
    global _template
    if _template is None:
        folder = Path(tempfile.mkdtemp(prefix="shingle-catalog-template-"))
        atexit.register(shutil.rmtree, folder, True)
        path = folder / "catalog.db"
        upgrade(f"sqlite:///{path}")
        # upgrade's connections are closed: the last one checkpointed the WAL into the file
        assert not Path(f"{path}-wal").exists(), "the template's WAL was not checkpointed"
        _template = path
    return _template


def migrate_sqlite(url: str) -> None:
    """``upgrade(url)`` for a SQLite catalog file that does not exist yet (owner-only, as
    upgrade makes it); any other URL is upgraded."""
    parsed = make_url(url)
    path = Path(parsed.database or "")
    if parsed.get_backend_name() != "sqlite" or not parsed.database or path.exists():
        upgrade(url)
        return
    template = _template_file()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out, open(template, "rb") as src:
        shutil.copyfileobj(src, out)
