"""What the durable commit of a small overwrite costs the catalog: statements per COMMIT of a 4 KiB
write into the middle of a file's extent, and what the file reads back."""

from __future__ import annotations

import random
import re

import pytest
from dphelpers import Engine, KiB, MiB, check_accounting
from migrated import migrate_sqlite
from sqlalchemy import event

from engine.base.blocking import WouldBlock, no_blocking
from engine.catalog import Catalog
from engine.namespace import ROOT


def test_an_overwrite_commit_runs_few_statements_and_reads_back(tmp_path):
    url = f"sqlite:///{tmp_path}/catalog.db"
    migrate_sqlite(url)
    catalog = Catalog(url)
    statements: list[str] = []

    @event.listens_for(catalog.engine, "connect")
    def trace(dbapi_conn, _record):
        dbapi_conn.set_trace_callback(statements.append)

    eng = Engine(catalog, tmp_path / "drives")
    try:
        ns = eng.ns
        ino = ns.create(ROOT, ns.root_ino, "f").ino
        expect = bytearray(random.Random(1).randbytes(2 * MiB))
        ns.write(ino, 0, bytes(expect))
        ns.commit(ino)
        rng = random.Random(2)
        counts = []
        # inside extents, never at an edge of an earlier overwrite
        for offset in (n * 16 * KiB for n in rng.sample(range(1, 127), 20)):
            block = rng.randbytes(4 * KiB)
            expect[offset : offset + len(block)] = block
            ns.write(ino, offset, block)
            statements.clear()
            ns.commit(ino)
            sql = [s for s in statements if not re.match(r"(BEGIN|COMMIT|PRAGMA)", s)]
            counts.append(len(sql))
            # the extent cut keeps its row; the cut stripe's row and fragments are one read
            assert not [s for s in sql if s.startswith("DELETE FROM extents")], sql
            reads = [s for s in sql if re.match(r"SELECT .*\b(stripes|fragments)\b", s)]
            assert len(reads) == 1, reads
        assert ns.read(ino, 0, 2 * MiB) == expect
        check_accounting(catalog)
        # statement steps (an executemany counts each row): the new stripe and its inline bytes,
        # the inode, the extents under the write (one SELECT), the cut extent shortened, the
        # new piece and the rest inserted, the cut stripe (one SELECT, its live bytes and the
        # new one's, its ten fragments' zones), the namespace's re-read of the inode and its
        # data ranges: 22, against 24 when the cut extent was deleted and inserted again and
        # the stripe and its fragments were two reads
        assert max(counts) <= 22, counts
    finally:
        eng.close()
        catalog.close()


def test_a_flush_inside_no_blocking_returns_only_when_there_is_nothing_to_flush(sqlite_engine):
    ns, data = sqlite_engine.ns, sqlite_engine.data
    ino = ns.create(ROOT, ns.root_ino, "g").ino
    ns.write(ino, 0, b"a" * 4 * KiB)
    with no_blocking(), pytest.raises(WouldBlock):
        data.flush(ino)
    assert data.pending_size(ino) == 4 * KiB  # nothing was taken from the buffer
    data.flush(ino)
    with no_blocking():
        data.flush(ino)  # all durable already: returns at once
    assert ns.read(ino, 0, 8 * KiB) == b"a" * 4 * KiB
