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
    upgrade(empty_url)
    assert current_revision(empty_url) == head_revision()
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
