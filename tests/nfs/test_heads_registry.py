"""The heads' registry and cluster-wide grace period in the catalog (appliance/nfs/state/
heads.py), on SQLite and PostgreSQL, without NFS: a head is expired only by compare and
delete on the counter another head watched stand still (one that beat meanwhile survives),
an expired head learns it at its next beat, and the grace epochs move as NFS-Ganesha's
rados_cluster moves them (start, join, lift by the last head that needed it)."""

from __future__ import annotations

import threading
import time

from sqlalchemy import select

from appliance.nfs.fh import KEY_SETTING, HandleCodec
from appliance.nfs.state.heads import GRACE, HEADS, HeadRegistry
from engine.catalog import Catalog


def _epochs(catalog) -> tuple[int, int]:
    row = catalog.read(lambda conn: conn.execute(select(GRACE)).one())
    return row.current_epoch, row.recovery_epoch


def _flags(catalog) -> dict[str, tuple[bool, bool]]:
    rows = catalog.read(lambda conn: conn.execute(select(HEADS)).all())
    return {row.name: (row.need_grace, row.enforcing) for row in rows}


def test_heads_expire_by_compare_and_delete_and_grace_epochs_move(catalog):
    lease = 0.3
    a, b = HeadRegistry(catalog, "head0", lease), HeadRegistry(catalog, "head1", lease)
    a.join()
    b.join()
    assert b.expire_dead(adopt=True) == []  # first sight: nothing is old yet
    time.sleep(lease + 0.1)
    # B has watched A's counter for a lease; A beats just before B acts: it survives
    rows = catalog.read(lambda conn: conn.execute(select(HEADS)).all())
    stale = b.observe(rows)
    assert [name for name, _, _ in stale] == ["head0"]
    assert a.beat()
    assert catalog.run(lambda conn: b._expire(conn, stale[0], True)) is None
    assert set(_flags(catalog)) == {"head0", "head1"}
    # silent for a lease now: expired, and A finds out at its next beat
    b.observe(catalog.read(lambda conn: conn.execute(select(HEADS)).all()))
    time.sleep(lease + 0.1)
    taken = b.expire_dead(adopt=True)
    assert [t.head for t in taken] == ["head0"]
    assert set(_flags(catalog)) == {"head1"}
    assert not a.beat()
    assert b.beat()

    # the grace epochs (one catalog fixture for both parts: each costs a migration)
    assert _epochs(catalog) == (1, 0)  # no grace period for a head without clients
    a, b, c = (HeadRegistry(catalog, f"head{i}", 90) for i in range(3))
    c.join()
    a.join(need_grace=True)  # a restart with clients to let reclaim: R = C, C = C + 1
    assert _epochs(catalog) == (2, 1)
    assert a.cluster_grace and _flags(catalog)["head0"] == (True, True)
    b.join(need_grace=True)  # joins the grace period in force
    assert _epochs(catalog) == (2, 1)
    assert c.beat() and c.cluster_grace  # C enforces from its next beat
    assert _flags(catalog)["head2"] == (False, True)
    a.lift()  # B still needs it
    assert _epochs(catalog) == (2, 1) and a.cluster_grace
    b.lift()  # the last NEED: over
    assert _epochs(catalog) == (2, 0) and not b.cluster_grace
    assert c.beat() and not c.cluster_grace
    assert _flags(catalog)["head2"] == (False, False)
    a.join(need_grace=True)  # a new grace period is a new epoch
    assert _epochs(catalog) == (3, 2)


def test_heads_starting_at_once_share_one_file_handle_key(catalog_url):
    """The heads of `serve --heads N` start at once over a new catalog: each must use the one
    key the catalog keeps (a head that overwrote another's made that head's handles
    BADHANDLE after its restart)."""
    catalogs = [Catalog(catalog_url) for _ in range(2)]
    try:
        start = threading.Barrier(8)
        codecs: list[HandleCodec] = []

        def head(catalog) -> None:
            start.wait()
            codecs.append(HandleCodec(catalog))

        threads = [threading.Thread(target=head, args=(catalogs[i % 2],)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        stored = bytes.fromhex(catalogs[0].get_setting(KEY_SETTING) or "")
        assert len(codecs) == 8
        assert {codec.key for codec in codecs} == {stored}
        assert len({codec.fsid for codec in codecs}) == 1
    finally:
        for catalog in catalogs:
            catalog.close()
