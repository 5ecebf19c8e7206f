"""Alembic, driven from code: ``shingle init`` and tests upgrade with these."""

from __future__ import annotations

import os
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, make_url

import migrations


def bounded_url(url: str) -> str:
    """A PostgreSQL URL that gives up after 5 s: a check (doctor, install) must not hang on an
    unreachable host."""
    if url.startswith("postgresql") and "connect_timeout=" not in url:
        return url + ("&" if "?" in url else "?") + "connect_timeout=5"
    return url


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    # ConfigParser interpolation: a literal % in a password must be doubled.
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def create_private_sqlite(url: str) -> None:
    """Create a new SQLite catalog file owner-only before SQLite opens it (SQLite would create it
    with the umask's 0644, and its -wal and -shm files copy the database file's mode): it holds
    inline file data, the file-handle key and the admins' password hashes."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return
    path = Path(parsed.database)
    if path.exists():
        return
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass  # another process made it first; its mode is its creator's business


def upgrade(url: str, revision: str = "head") -> None:
    create_private_sqlite(url)
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(url), revision)


def current_revision(url: str) -> str | None:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    if head is None:
        raise RuntimeError("no schema migrations found in migrations/versions")
    return head
