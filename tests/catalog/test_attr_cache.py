"""The namespace's attribute and name cache (SQLite): this process's own writes
keep it warm and exact, another process's commits clear it, and a load that
raced an eviction is never cached."""

from __future__ import annotations

import threading
import time

import pytest

from engine.base import errors
from engine.base.blocking import WouldBlock, no_blocking
from engine.catalog import Catalog
from engine.catalog.models import REG
from engine.namespace import ROOT, Namespace
from engine.namespace import reads as reads_module


def test_own_writes_keep_the_rest_of_the_cache(sqlite_catalog, count_reads):
    ns = Namespace(sqlite_catalog)
    d = ns.mkdir(ROOT, ns.root_ino, "d", 0o755)
    a = ns.create(ROOT, d.ino, "a", 0o644)
    ns.lookup(ROOT, d.ino, "a")
    reads = count_reads(sqlite_catalog)
    ns.create(ROOT, d.ino, "b", 0o644)  # an unrelated change by this process
    assert ns.lookup(ROOT, d.ino, "a").ino == a.ino
    assert ns.getattr(d.ino).ino == d.ino
    assert reads == [], "own write cleared entries it did not touch"
    # what the write did change is exact at once, without a query
    before = ns.getattr(a.ino)
    ns.setattr(ROOT, a.ino, mode=0o600)
    after = ns.getattr(a.ino)
    assert after.mode == 0o600 and after.change > before.change
    assert reads == []


def test_own_unlink_and_rename_are_seen(sqlite_catalog):
    ns = Namespace(sqlite_catalog)
    d = ns.mkdir(ROOT, ns.root_ino, "d", 0o755)
    a = ns.create(ROOT, d.ino, "a", 0o644)
    b = ns.create(ROOT, d.ino, "b", 0o644)
    ns.lookup(ROOT, d.ino, "a")
    ns.lookup(ROOT, d.ino, "b")
    ns.rename(ROOT, d.ino, "a", d.ino, "b")  # a replaces b
    assert ns.lookup(ROOT, d.ino, "b").ino == a.ino
    with pytest.raises(errors.NotFound):
        ns.lookup(ROOT, d.ino, "a")
    with pytest.raises(
        errors.StaleHandle
    ):  # the replaced file was freed: not served from the cache
        ns.getattr(b.ino)


def test_other_process_commit_clears_the_cache(sqlite_catalog):
    ns = Namespace(sqlite_catalog)
    f = ns.create(ROOT, ns.root_ino, "f", 0o644)
    assert ns.getattr(f.ino).mode == 0o644
    other = Catalog(sqlite_catalog.url)  # its own connections: to SQLite, another process
    try:
        Namespace(other).setattr(ROOT, f.ino, mode=0o640)
        # a write decision looks afresh at once: the mode is 0o640 now, so 0o644 is a change
        ns.setattr(ROOT, f.ino, mode=0o644)
        assert Namespace(other).getattr(f.ino).mode == 0o644, (
            "the change back was taken for a no-op"
        )
        Namespace(other).setattr(ROOT, f.ino, mode=0o640)
    finally:
        other.close()
    # reads see it at once too (the epoch is the WAL index header, read afresh every time)
    assert ns.getattr(f.ino).mode == 0o640
    assert ns.lookup(ROOT, ns.root_ino, "f").mode == 0o640


def test_load_that_raced_an_eviction_is_not_cached(sqlite_catalog):
    ns = Namespace(sqlite_catalog)
    f = ns.create(ROOT, ns.root_ino, "f", 0o644)
    ns.getattr(f.ino)
    ns.cache.attrs.clear()
    original = sqlite_catalog.read
    loaded, go_on = threading.Event(), threading.Event()

    def slow_read(work):
        result = original(work)  # the old attributes
        loaded.set()
        go_on.wait(10)
        return result

    sqlite_catalog.read = slow_read
    seen = []
    reader = threading.Thread(target=lambda: seen.append(ns.getattr(f.ino)))
    reader.start()
    assert loaded.wait(10)
    sqlite_catalog.read = original
    ns.setattr(ROOT, f.ino, mode=0o600)  # commits and evicts while the reader holds old values
    ns.cache.attrs.pop(f.ino, None)
    go_on.set()
    reader.join(10)
    assert seen[0].mode == 0o644  # the racing reader may see the old value ...
    assert ns.getattr(f.ino).mode == 0o600  # ... but must not leave it in the cache


def test_setattr_that_changes_nothing_needs_no_write_but_still_checks_permission(
    sqlite_catalog, count_reads
):
    ns = Namespace(sqlite_catalog)
    f = ns.create(ROOT, ns.root_ino, "f", 0o644)
    writes = []
    original_run = sqlite_catalog.run

    def run(work, **kw):
        writes.append(kw)
        return original_run(work, **kw)

    sqlite_catalog.run = run
    reads = count_reads(sqlite_catalog)
    same = ns.setattr(
        ROOT, f.ino, mode=0o644, size=0, uid=0
    )  # what clients send right after a create
    assert (same.mode, same.size, same.change, same.ctime_ns) == (0o644, 0, f.change, f.ctime_ns)
    assert writes == [] and reads == [], "a setattr that changes nothing opened a transaction"
    from engine.namespace import Cred

    with pytest.raises(
        errors.NotPermitted
    ):  # the same mode, but not the owner: refused all the same
        ns.setattr(Cred(1000, 1000), f.ino, mode=0o644)
    changed = ns.setattr(ROOT, f.ino, mode=0o600)
    assert changed.mode == 0o600 and changed.change > f.change and writes


def test_cache_size_is_bounded(sqlite_catalog, monkeypatch):
    import engine.namespace.cache as cache_module

    monkeypatch.setattr(cache_module, "CACHE_MAX_ENTRIES", 10)
    ns = Namespace(sqlite_catalog)
    made = {f"f{i}": ns.create(ROOT, ns.root_ino, f"f{i}", 0o644).ino for i in range(30)}
    ns.invalidate()
    for name, ino in made.items():
        assert ns.lookup(ROOT, ns.root_ino, name).ino == ino
        assert (
            len(ns.cache.attrs) + len(ns.cache.names) <= 10 + 3
        )  # one lookup adds two attributes and a name


def test_tracked_commits_of_this_process_keep_the_cache(sqlite_catalog, count_reads):
    """Commits this process accounts for itself (metrics samples, jobs, events, settings) leave
    the cache alone; before, every such commit emptied it (a stat of 2,000 files then paid a
    query each when the daemon's metrics sampler committed in between)."""
    from engine.admin import jobs
    from engine.admin.metrics import record_sample

    ns = Namespace(sqlite_catalog)
    f = ns.create(ROOT, ns.root_ino, "f", 0o644)
    ns.lookup(ROOT, ns.root_ino, "f")
    reads = count_reads(sqlite_catalog)
    record_sample(sqlite_catalog, nfs_ops=1.0)
    sqlite_catalog.set_setting("some", "value")
    jobs.submit(sqlite_catalog, "scrub")
    assert ns.lookup(ROOT, ns.root_ino, "f").ino == f.ino
    assert ns.getattr(f.ino).mode == 0o644
    assert reads == [], "a tracked commit that touches nothing cached emptied the cache"


def test_untracked_commit_of_this_process_clears_the_cache(sqlite_catalog):
    from engine.catalog.database import sql

    ns = Namespace(sqlite_catalog)
    f = ns.create(ROOT, ns.root_ino, "f", 0o644)
    assert ns.getattr(f.ino).mode & 0o777 == 0o644
    # a write outside the namespace that changes a cached row, as maintenance code might
    sqlite_catalog.run(
        lambda conn: sql(
            conn, "UPDATE inodes SET mode = (mode & ~511) | 384 WHERE ino = ?", (f.ino,)
        ).close()
    )
    assert ns.getattr(f.ino).mode & 0o777 == 0o600


def test_a_tracked_transaction_that_changed_nothing_claims_no_commit(sqlite_catalog):
    ns = Namespace(sqlite_catalog)
    f = ns.create(ROOT, ns.root_ino, "f", 0o644)
    assert ns.getattr(f.ino).mode & 0o777 == 0o644
    sqlite_catalog.run(
        lambda conn: None, tracked=True
    )  # commits no frames: the counter does not move
    other = Catalog(sqlite_catalog.url)  # the next commit is another process's
    try:
        Namespace(other).setattr(ROOT, f.ino, mode=0o600)
    finally:
        other.close()
    assert ns.getattr(f.ino).mode & 0o777 == 0o600, "another process's commit was taken for ours"


# The age backstop (CACHE_TTL_S): no entry is served longer than that after it was read, and
# reaching it drops only the entries that old, not the whole cache.
TTL_S = 1.0


@pytest.fixture
def short_ttl(monkeypatch):
    import engine.namespace.cache as cache_module

    monkeypatch.setattr(cache_module, "CACHE_TTL_S", TTL_S)


def test_the_age_limit_drops_only_entries_older_than_it(sqlite_catalog, count_reads, short_ttl):
    """Emptying the whole cache at the age limit sent every lookup after it to the catalog:
    a stat pass over files made just before then ran from the NFS workers."""
    ns = Namespace(sqlite_catalog)
    a = ns.create(ROOT, ns.root_ino, "a", 0o644)
    ns.invalidate()
    ns.lookup(ROOT, ns.root_ino, "a")  # read at about 0
    time.sleep(0.6 * TTL_S)
    b = ns.create(ROOT, ns.root_ino, "b", 0o644)  # its own write caches it, at about 0.6
    reads = count_reads(sqlite_catalog)
    time.sleep(0.5 * TTL_S)  # a is older than the limit now, b is not
    assert ns.lookup(ROOT, ns.root_ino, "b").ino == b.ino
    assert ns.getattr(b.ino).ino == b.ino
    assert reads == [], "the age limit dropped entries younger than it"
    assert ns.lookup(ROOT, ns.root_ino, "a").ino == a.ino
    assert reads == [1], "an entry older than the age limit was served from the cache"
    assert ns.lookup(ROOT, ns.root_ino, "a").ino == a.ino
    assert reads == [1], "the entry read again was not cached again"


def test_no_attribute_name_or_xattr_is_served_past_the_age_limit(
    sqlite_catalog, count_reads, short_ttl
):
    ns = Namespace(sqlite_catalog)
    d = ns.mkdir(ROOT, ns.root_ino, "d", 0o755)
    f = ns.create(ROOT, d.ino, "f", 0o644)
    ns.setxattr(ROOT, f.ino, "user.k", b"v")
    ns.invalidate()
    ns.lookup(ROOT, d.ino, "f")
    ns.listxattr(ROOT, f.ino)
    reads = count_reads(sqlite_catalog)
    ns.getattr(f.ino)
    ns.lookup(ROOT, d.ino, "f")
    ns.listxattr(ROOT, f.ino)
    assert reads == []
    time.sleep(1.1 * TTL_S)
    ns.getattr(f.ino)
    assert len(reads) == 1, "an attribute was served past the age limit"
    ns.lookup(ROOT, d.ino, "f")
    assert len(reads) == 2, "a name was served past the age limit"
    ns.listxattr(ROOT, f.ino)
    assert len(reads) == 3, "extended attributes were served past the age limit"
    # a SETATTR that changes nothing is answered from the cache only while it is young
    ns.cache.attrs[f.ino] = (ns.cache.attrs[f.ino][0], time.monotonic() - 1)
    writes = []
    original = sqlite_catalog.run
    sqlite_catalog.run = lambda work, **kw: writes.append(1) or original(work, **kw)
    try:
        ns.setattr(ROOT, f.ino, mode=0o644)
    finally:
        sqlite_catalog.run = original
    assert writes, "a no-op SETATTR trusted an entry past the age limit"


def _missing(ns, dir_ino: int, name: str) -> bool:
    """Whether the cache alone answers that ``name`` is not in ``dir_ino`` (else: WouldBlock,
    the lookup needs the catalog)."""
    with no_blocking():
        try:
            ns.lookup(ROOT, dir_ino, name)
        except errors.NotFound:
            return True
        except WouldBlock:
            return False
    raise AssertionError(f"{name!r} was found")


def test_a_small_directory_read_whole_proves_names_missing(
    sqlite_catalog, count_reads, monkeypatch
):
    """nfs-rs opens each name before it creates it: after one lookup of a missing name read the
    directory whole, the next missing names are answered from the cache, and every change keeps
    that answer exact or forgets it."""
    monkeypatch.setattr(reads_module, "COMPLETE_DIR_RETRY_S", 0.0)
    ns = Namespace(sqlite_catalog)
    d = ns.mkdir(ROOT, ns.root_ino, "d", 0o755)
    ns.create(ROOT, d.ino, "a", 0o644)
    ns.invalidate()
    assert not _missing(ns, d.ino, "x")
    with pytest.raises(errors.NotFound):
        ns.lookup(ROOT, d.ino, "x")  # reads the directory whole
    assert ns.lookup(ROOT, d.ino, "a").type == REG  # its name is known, its attributes read
    reads = count_reads(sqlite_catalog)
    assert _missing(ns, d.ino, "x") and _missing(ns, d.ino, "y")
    # a create and an unlink of this process say what the name is now: still complete
    b = ns.create(ROOT, d.ino, "b", 0o644)
    assert ns.lookup(ROOT, d.ino, "b").ino == b.ino and _missing(ns, d.ino, "y")
    ns.unlink(ROOT, d.ino, "a")
    assert _missing(ns, d.ino, "a") and _missing(ns, d.ino, "y")
    assert reads == []
    # a rename in: forgotten (the next missing name reads the directory again)
    ns.create(ROOT, ns.root_ino, "outside", 0o644)
    ns.rename(ROOT, ns.root_ino, "outside", d.ino, "moved")
    assert not _missing(ns, d.ino, "y")
    with pytest.raises(errors.NotFound):
        ns.lookup(ROOT, d.ino, "y")
    assert ns.lookup(ROOT, d.ino, "moved").type == REG
    assert _missing(ns, d.ino, "y")
    # another process's commit: forgotten, and its new name is found
    other = Catalog(sqlite_catalog.url)
    try:
        Namespace(other).create(ROOT, d.ino, "theirs", 0o644)
    finally:
        other.close()
    assert not _missing(ns, d.ino, "theirs")
    assert ns.lookup(ROOT, d.ino, "theirs").type == REG


def test_a_failed_create_forgets_that_the_directory_is_complete(sqlite_catalog):
    ns = Namespace(sqlite_catalog)
    d = ns.mkdir(ROOT, ns.root_ino, "d", 0o755)
    ns.create(ROOT, d.ino, "a", 0o644)
    with pytest.raises(errors.NotFound):
        ns.lookup(ROOT, d.ino, "x")
    with pytest.raises(errors.Exists):
        ns.create(ROOT, d.ino, "a", 0o644)
    assert not _missing(ns, d.ino, "x")


def test_a_big_directory_is_not_read_whole(sqlite_catalog, count_reads, monkeypatch):
    monkeypatch.setattr(reads_module, "COMPLETE_DIR_MAX", 3)
    ns = Namespace(sqlite_catalog)
    d = ns.mkdir(ROOT, ns.root_ino, "d", 0o755)
    for name in "abcd":
        ns.create(ROOT, d.ino, name, 0o644)
    with pytest.raises(errors.NotFound):
        ns.lookup(ROOT, d.ino, "x")
    assert not _missing(ns, d.ino, "y")
    ns.unlink(ROOT, d.ino, "d")  # three names now, but not read whole again at once
    with pytest.raises(errors.NotFound):
        ns.lookup(ROOT, d.ino, "x")
    assert not _missing(ns, d.ino, "y")


def test_a_directory_is_read_whole_at_most_once_a_retry_time(sqlite_catalog, monkeypatch):
    """Renames into a directory forget its completeness each time (as rsync's temporary names
    would): the lookups of missing names then do not read it whole again and again."""
    monkeypatch.setattr(reads_module, "COMPLETE_DIR_RETRY_S", 0.5)
    ns = Namespace(sqlite_catalog)
    d = ns.mkdir(ROOT, ns.root_ino, "d", 0o755)
    with pytest.raises(errors.NotFound):
        ns.lookup(ROOT, d.ino, "x")
    ns.create(ROOT, ns.root_ino, "outside", 0o644)
    ns.rename(ROOT, ns.root_ino, "outside", d.ino, "moved")
    with pytest.raises(errors.NotFound):
        ns.lookup(ROOT, d.ino, "x")
    assert not _missing(ns, d.ino, "y")
    time.sleep(0.6)
    with pytest.raises(errors.NotFound):
        ns.lookup(ROOT, d.ino, "x")
    assert _missing(ns, d.ino, "y")


def test_names_read_whole_expire_with_the_directory(sqlite_catalog, short_ttl):
    ns = Namespace(sqlite_catalog)
    d = ns.mkdir(ROOT, ns.root_ino, "d", 0o755)
    with pytest.raises(errors.NotFound):
        ns.lookup(ROOT, d.ino, "x")
    ns.getattr(d.ino)
    assert _missing(ns, d.ino, "x")
    time.sleep(1.1 * TTL_S)
    ns.getattr(d.ino)  # the directory's attributes are fresh again, its listing is not
    assert not _missing(ns, d.ino, "x")


def test_a_removed_directory_is_complete_no_more(sqlite_catalog):
    """SQLite may give a freed inode number to the next new inode: what was known of the
    removed directory's names must not answer for it."""
    ns = Namespace(sqlite_catalog)
    d = ns.mkdir(ROOT, ns.root_ino, "d", 0o755)
    with pytest.raises(errors.NotFound):
        ns.lookup(ROOT, d.ino, "x")
    assert _missing(ns, d.ino, "x")
    ns.rmdir(ROOT, ns.root_ino, "d")
    f = ns.create(ROOT, ns.root_ino, "f", 0o644)
    ns.getattr(f.ino)
    assert not ns.cache.complete_dirs, "the removed directory is still complete"
    if f.ino == d.ino:  # the number was given again: a lookup in a file is ENOTDIR
        with pytest.raises(errors.NotADirectory):
            ns.lookup(ROOT, f.ino, "x")


def test_create_and_setxattr_leave_the_xattrs_samba_reads_next_in_the_cache(
    sqlite_catalog, count_reads
):
    """Samba reads a new file's DOS attribute (and its folder's ACLs) right after the create,
    and reads the attribute back right after setting it: all from the cache, exact."""
    ns = Namespace(sqlite_catalog)
    d = ns.mkdir(ROOT, ns.root_ino, "d", 0o755)
    ns.setxattr(ROOT, d.ino, "user.dir", b"folder")
    assert ns.listxattr(ROOT, d.ino) == ["user.dir"]  # cached
    f = ns.create(ROOT, d.ino, "f", 0o644)
    reads = count_reads(sqlite_catalog)
    with no_blocking():
        with pytest.raises(errors.NoData):
            ns.getxattr(ROOT, f.ino, "user.DOSATTRIB")  # a new file has none
        assert ns.getxattr(ROOT, d.ino, "user.dir") == b"folder"  # the create kept the folder's
        assert ns.getattr(d.ino).mtime_ns >= ns.getattr(f.ino).mtime_ns
    before = ns.getattr(f.ino)
    ns.setxattr(ROOT, f.ino, "user.DOSATTRIB", b"dos-1")
    ns.setxattr(ROOT, f.ino, "user.other", b"x")
    with no_blocking():
        assert ns.getxattr(ROOT, f.ino, "user.DOSATTRIB") == b"dos-1"
        assert ns.listxattr(ROOT, f.ino) == ["user.DOSATTRIB", "user.other"]
        assert ns.getattr(f.ino).change > before.change  # the ctime bump is seen too
    ns.setxattr(ROOT, f.ino, "user.DOSATTRIB", b"dos-2", replace_only=True)
    with no_blocking():
        assert ns.getxattr(ROOT, f.ino, "user.DOSATTRIB") == b"dos-2"
    ns.removexattr(ROOT, f.ino, "user.other")  # evicts: read again, exact
    assert ns.listxattr(ROOT, f.ino) == ["user.DOSATTRIB"]
    assert len(reads) == 1
    # a value too big for the cache is not kept: read each time
    ns.setxattr(ROOT, f.ino, "user.big", bytes(5000))
    with no_blocking(), pytest.raises(WouldBlock):
        ns.getxattr(ROOT, f.ino, "user.big")
    assert ns.getxattr(ROOT, f.ino, "user.big") == bytes(5000)
    # what another process sees is the same as what the cache said
    fresh = Namespace(Catalog(sqlite_catalog.url))
    try:
        assert fresh.getxattr(ROOT, f.ino, "user.DOSATTRIB") == b"dos-2"
        assert fresh.listxattr(ROOT, f.ino) == ["user.DOSATTRIB", "user.big"]
    finally:
        fresh.catalog.close()
