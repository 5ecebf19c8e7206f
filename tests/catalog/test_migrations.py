"""Alembic owns the schema: head matches the models, and upgrade/downgrade round-trip."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from engine.catalog import current_revision, downgrade, upgrade
from engine.catalog.migrate import head_revision
from engine.catalog.models import Base


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/empty.db"
    return request.getfixturevalue("postgres_server").create_database()


def tables(url):
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_upgrade_from_empty_and_downgrade_to_base(empty_url):
    assert tables(empty_url) == set()
    upgrade(empty_url, "0023")
    _snapshot_copied_whole(empty_url)  # 0024 makes its range its one block
    upgrade(empty_url)
    assert current_revision(empty_url) == head_revision()
    assert _blocks(empty_url) == ([(10, 11, "s", None)], 0)
    assert tables(empty_url) == set(Base.metadata.tables)
    downgrade(empty_url, "base")
    assert current_revision(empty_url) is None
    assert tables(empty_url) == set()
    upgrade(empty_url)  # and back up again: downgrades leave nothing behind
    assert tables(empty_url) == set(Base.metadata.tables)


def test_autogenerate_finds_no_difference(empty_url):
    upgrade(empty_url)
    engine = create_engine(empty_url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            diff = compare_metadata(context, Base.metadata)
    finally:
        engine.dispose()
    assert diff == [], f"models and migrations differ: {diff}"


def _snapshot_copied_whole(url) -> None:
    """A snapshot as every revision before 0024 made them: one range of inodes [10, 11]."""
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            for ino in (1, 10, 11):
                conn.exec_driver_sql(
                    "INSERT INTO inodes (ino, generation, type, mode, uid, gid, size, nlink, "
                    "rdev, atime_ns, mtime_ns, ctime_ns, btime_ns, change, band_class) "
                    f"VALUES ({ino}, 1, 2, 493, 0, 0, 0, 2, 0, 0, 0, 0, 0, 1, 'hot')"
                )
            conn.exec_driver_sql(
                "INSERT INTO snapshots (name, source_ino, root_ino, ino_lo, ino_hi, created_ns, "
                "deleting) VALUES ('s', 1, 10, 10, 11, 0, false)"
            )
    finally:
        engine.dispose()


def _blocks(url) -> tuple[list[tuple], int]:
    """(ino_lo, ino_hi, snapshot name, top_ino) of every block, and the live->view rows."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            blocks = conn.exec_driver_sql(
                "SELECT b.ino_lo, b.ino_hi, s.name, s.top_ino FROM snapshot_blocks b "
                "JOIN snapshots s ON s.id = b.snapshot_id"
            ).all()
            mapped = conn.exec_driver_sql("SELECT COUNT(*) FROM snapshot_inodes").scalar()
    finally:
        engine.dispose()
    return [tuple(b) for b in blocks], int(mapped)
