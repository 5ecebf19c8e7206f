"""The namespace API on SQLite and on PostgreSQL (every test runs on both)."""

from __future__ import annotations

import errno
import time

import pytest

from engine.base import errors
from engine.base.blocking import no_blocking
from engine.catalog.models import DIR, LNK, REG
from engine.namespace import R_OK, ROOT, SET_TO_NOW, W_OK, X_OK, Cred, Namespace

ALICE = Cred(1000, 1000)
BOB = Cred(1001, 1001)


def names(ns, ino, cred=ROOT):
    entries, eof = ns.readdir(cred, ino)
    assert eof
    return sorted(e.name for e in entries)


@pytest.fixture
def home(namespace):
    """A world-writable folder, like /tmp, so that users can work in it."""
    return namespace.mkdir(ROOT, namespace.root_ino, "home", 0o777)


def test_create_lookup_getattr(namespace):
    ns = namespace
    f = ns.create(ALICE if False else ROOT, ns.root_ino, "a.bin", 0o640)
    assert f.type == REG and f.mode == 0o640 and f.nlink == 1 and f.size == 0
    assert ns.lookup(ROOT, ns.root_ino, "a.bin") == f
    assert ns.getattr(f.ino) == f
    assert ns.getattr(ns.root_ino).change > 1  # parent changed


def test_errors_carry_errno(namespace, home):
    ns = namespace
    ns.create(ROOT, home.ino, "x")
    with pytest.raises(errors.Exists) as exc:
        ns.create(ROOT, home.ino, "x")
    assert exc.value.errno == errno.EEXIST
    with pytest.raises(errors.NotFound) as exc:
        ns.lookup(ROOT, home.ino, "missing")
    assert exc.value.errno == errno.ENOENT
    with pytest.raises(errors.NameTooLong) as exc:
        ns.create(ROOT, home.ino, "n" * 256)
    assert exc.value.errno == errno.ENAMETOOLONG
    ns.create(ROOT, home.ino, "n" * 255)  # the limit itself is fine
    for bad in ("", ".", "..", "a/b", "a\0b"):
        with pytest.raises(errors.InvalidArgument):
            ns.create(ROOT, home.ino, bad)
    f = ns.lookup(ROOT, home.ino, "x")
    with pytest.raises(errors.NotADirectory):
        ns.create(ROOT, f.ino, "y")
    with pytest.raises(errors.NotADirectory):
        ns.readdir(ROOT, f.ino)


def test_create_not_exclusive_returns_existing(namespace, home):
    first = namespace.create(ROOT, home.ino, "f")
    again = namespace.create(ROOT, home.ino, "f", exclusive=False)
    assert again.ino == first.ino


def test_mkdir_rmdir_link_counts(namespace, home):
    ns = namespace
    before = ns.getattr(home.ino).nlink
    d = ns.mkdir(ROOT, home.ino, "d")
    assert d.nlink == 2 and ns.getattr(home.ino).nlink == before + 1
    ns.mkdir(ROOT, d.ino, "sub")
    assert ns.getattr(d.ino).nlink == 3
    with pytest.raises(errors.NotEmpty):
        ns.rmdir(ROOT, home.ino, "d")
    with pytest.raises(errors.NotADirectory):
        ns.create(ROOT, d.ino, "file") and ns.rmdir(ROOT, d.ino, "file")
    with pytest.raises(errors.IsADirectory):
        ns.unlink(ROOT, d.ino, "sub")
    ns.rmdir(ROOT, d.ino, "sub")
    ns.unlink(ROOT, d.ino, "file")
    ns.rmdir(ROOT, home.ino, "d")
    assert ns.getattr(home.ino).nlink == before
    with pytest.raises(errors.StaleHandle):
        ns.getattr(d.ino)


def test_hard_links(namespace, home):
    ns = namespace
    f = ns.create(ROOT, home.ino, "f")
    linked = ns.link(ROOT, f.ino, home.ino, "g")
    assert linked.nlink == 2
    ns.unlink(ROOT, home.ino, "f")
    assert ns.lookup(ROOT, home.ino, "g").nlink == 1
    d = ns.mkdir(ROOT, home.ino, "d")
    with pytest.raises(errors.NotPermitted):
        ns.link(ROOT, d.ino, home.ino, "dlink")
    with pytest.raises(errors.Exists):
        ns.link(ROOT, f.ino, home.ino, "d")


def test_symlink_readlink_resolve(namespace, home):
    ns = namespace
    d = ns.mkdir(ROOT, home.ino, "real")
    target = ns.create(ROOT, d.ino, "file")
    link = ns.symlink(ROOT, home.ino, "alias", "real")
    assert link.type == LNK and link.size == len("real")
    assert ns.readlink(link.ino) == b"real"
    assert ns.resolve("/home/alias/file").ino == target.ino
    assert ns.resolve("/home/alias", follow=False).ino == link.ino
    with pytest.raises(errors.InvalidArgument):
        ns.readlink(target.ino)
    assert ns.path_of(target.ino) == "/home/real/file"


def test_rename_file_over_existing(namespace, home):
    ns = namespace
    a = ns.create(ROOT, home.ino, "a")
    b = ns.create(ROOT, home.ino, "b")
    ns.rename(ROOT, home.ino, "a", home.ino, "b")
    assert names(ns, home.ino) == ["b"]
    assert ns.lookup(ROOT, home.ino, "b").ino == a.ino
    with pytest.raises(errors.StaleHandle):
        ns.getattr(b.ino)  # the replaced file is freed


def test_rename_same_inode_is_noop(namespace, home):
    ns = namespace
    f = ns.create(ROOT, home.ino, "a")
    ns.link(ROOT, f.ino, home.ino, "b")
    ns.rename(ROOT, home.ino, "a", home.ino, "b")
    assert names(ns, home.ino) == ["a", "b"]


def test_rename_directories(namespace, home):
    ns = namespace
    src = ns.mkdir(ROOT, home.ino, "src")
    dst = ns.mkdir(ROOT, home.ino, "dst")
    moving = ns.mkdir(ROOT, src.ino, "m")
    ns.create(ROOT, moving.ino, "inside")
    ns.rename(ROOT, src.ino, "m", dst.ino, "m2")
    assert ns.getattr(src.ino).nlink == 2 and ns.getattr(dst.ino).nlink == 3
    assert ns.lookup(ROOT, ns.lookup(ROOT, dst.ino, "m2").ino, "..").ino == dst.ino
    # into its own subtree: refused
    with pytest.raises(errors.InvalidArgument):
        ns.rename(ROOT, home.ino, "dst", moving.ino, "loop")
    # over a non-empty directory: refused; over an empty one: replaces it
    full = ns.mkdir(ROOT, home.ino, "full")
    ns.create(ROOT, full.ino, "x")
    with pytest.raises(errors.NotEmpty):
        ns.rename(ROOT, home.ino, "src", home.ino, "full")
    empty = ns.mkdir(ROOT, home.ino, "empty")
    links = ns.getattr(home.ino).nlink
    ns.rename(ROOT, home.ino, "src", home.ino, "empty")
    assert ns.getattr(home.ino).nlink == links - 1
    with pytest.raises(errors.StaleHandle):
        ns.getattr(empty.ino)
    # directory over file and file over directory
    f = ns.create(ROOT, home.ino, "file")
    with pytest.raises(errors.NotADirectory):
        ns.rename(ROOT, home.ino, "empty", home.ino, "file")
    with pytest.raises(errors.IsADirectory):
        ns.rename(ROOT, home.ino, "file", home.ino, "empty")
    assert ns.lookup(ROOT, home.ino, "file").ino == f.ino
    with pytest.raises(errors.NotFound):
        ns.rename(ROOT, home.ino, "nope", home.ino, "x")


def test_readdir_cookies_survive_changes(namespace, home):
    ns = namespace
    for i in range(10):
        ns.create(ROOT, home.ino, f"f{i}")
    page, eof = ns.readdir(ROOT, home.ino, 0, limit=4)
    assert not eof and [e.name for e in page] == ["f0", "f1", "f2", "f3"]
    cookie = page[-1].cookie
    ns.unlink(ROOT, home.ino, "f3")  # the cookie's own entry goes away
    ns.unlink(ROOT, home.ino, "f5")
    ns.create(ROOT, home.ino, "late")
    rest, eof = ns.readdir(ROOT, home.ino, cookie, limit=100)
    assert eof
    assert [e.name for e in rest] == ["f4", "f6", "f7", "f8", "f9", "late"]


def test_readdir_large_directory_pages(namespace, home):
    ns = namespace
    want = {f"n{i:04d}" for i in range(300)}
    for name in want:
        ns.create(ROOT, home.ino, name)
    seen, cookie = [], 0
    while True:
        page, eof = ns.readdir(ROOT, home.ino, cookie, limit=64)
        seen += [e.name for e in page]
        if eof:
            break
        cookie = page[-1].cookie
    assert sorted(seen) == sorted(want) and len(seen) == len(want)


def test_permissions(namespace, home):
    ns = namespace
    private = ns.mkdir(ALICE, home.ino, "alice", 0o700)
    assert private.uid == ALICE.uid and private.gid == ALICE.gid
    with pytest.raises(errors.AccessDenied) as exc:
        ns.create(BOB, private.ino, "intruder")
    assert exc.value.errno == errno.EACCES
    with pytest.raises(errors.AccessDenied):
        ns.readdir(BOB, private.ino)
    with pytest.raises(errors.AccessDenied):
        ns.lookup(BOB, private.ino, "anything")
    mine = ns.create(ALICE, private.ino, "mine", 0o600)
    assert ns.access(BOB, mine.ino, R_OK | W_OK) == 0
    assert ns.access(ALICE, mine.ino, R_OK | W_OK | X_OK) == R_OK | W_OK
    assert (
        ns.access(ROOT, mine.ino, R_OK | W_OK | X_OK) == R_OK | W_OK
    )  # root: no x without an x bit
    group_reader = Cred(1002, 50, groups=(1000,))
    ns.setattr(ALICE, mine.ino, mode=0o640)
    assert ns.access(group_reader, mine.ino, R_OK | W_OK) == R_OK


def test_sticky_directory(namespace):
    ns = namespace
    tmp = ns.mkdir(ROOT, ns.root_ino, "tmp", 0o1777)
    ns.create(ALICE, tmp.ino, "alices")
    with pytest.raises(errors.NotPermitted):
        ns.unlink(BOB, tmp.ino, "alices")
    with pytest.raises(errors.NotPermitted):
        ns.rename(BOB, tmp.ino, "alices", tmp.ino, "stolen")
    ns.unlink(ALICE, tmp.ino, "alices")


def test_setattr_rules(namespace, home):
    ns = namespace
    f = ns.create(ALICE, home.ino, "f", 0o644)
    with pytest.raises(errors.NotPermitted):
        ns.setattr(BOB, f.ino, mode=0o777)
    with pytest.raises(errors.NotPermitted):
        ns.setattr(ALICE, f.ino, uid=BOB.uid)  # only root gives files away
    with pytest.raises(errors.NotPermitted):
        ns.setattr(ALICE, f.ino, gid=4242)  # not one of her groups
    assert ns.setattr(ROOT, f.ino, uid=BOB.uid, gid=BOB.gid).uid == BOB.uid
    ns.setattr(ROOT, f.ino, mode=0o6755)
    after = ns.setattr(BOB, f.ino, gid=BOB.gid, uid=BOB.uid)  # no-op chown keeps bits
    assert after.mode == 0o6755
    with pytest.raises(errors.NotPermitted):
        ns.setattr(ALICE, f.ino, mtime_ns=1)
    stamped = ns.setattr(BOB, f.ino, atime_ns=1_000_000_000, mtime_ns=2_000_000_000)
    assert (stamped.atime_ns, stamped.mtime_ns) == (1_000_000_000, 2_000_000_000)
    with pytest.raises(errors.AccessDenied):
        ns.setattr(ALICE, f.ino, mtime_ns=SET_TO_NOW)  # not owner, no write permission
    assert ns.setattr(BOB, f.ino, mtime_ns=SET_TO_NOW).mtime_ns > 2_000_000_000
    with pytest.raises(errors.InvalidArgument):
        ns.setattr(ROOT, f.ino, size=-1)
    d = ns.mkdir(ROOT, home.ino, "d")
    with pytest.raises(errors.IsADirectory):
        ns.setattr(ROOT, d.ino, size=0)
    before = ns.getattr(f.ino)
    ns.setattr(ROOT, f.ino, mode=0o600)
    assert (
        ns.getattr(f.ino).change > before.change and ns.getattr(f.ino).ctime_ns >= before.ctime_ns
    )


def test_setgid_directory_inherits_group(namespace, home):
    ns = namespace
    shared = ns.mkdir(ROOT, home.ino, "shared", 0o2777)
    ns.setattr(ROOT, shared.ino, gid=500)
    f = ns.create(ALICE, shared.ino, "f")
    sub = ns.mkdir(ALICE, shared.ino, "sub")
    assert f.gid == 500 and sub.gid == 500 and sub.mode & 0o2000


def test_xattrs(namespace, home):
    ns = namespace
    f = ns.create(ROOT, home.ino, "f")
    ns.setxattr(ROOT, f.ino, "user.dataset", b"v1")
    assert ns.getxattr(ROOT, f.ino, "user.dataset") == b"v1"
    with pytest.raises(errors.Exists):
        ns.setxattr(ROOT, f.ino, "user.dataset", b"v2", create=True)
    ns.setxattr(ROOT, f.ino, "user.dataset", b"v2", replace_only=True)
    assert ns.listxattr(ROOT, f.ino) == ["user.dataset"]
    ns.removexattr(ROOT, f.ino, "user.dataset")
    with pytest.raises(errors.NoData):
        ns.getxattr(ROOT, f.ino, "user.dataset")
    with pytest.raises(errors.InvalidArgument):
        ns.setxattr(ROOT, f.ino, "user.big", b"x" * (64 * 1024 + 1))


def test_open_file_survives_unlink_until_closed(namespace, home):
    ns = namespace
    f = ns.create(ROOT, home.ino, "f")
    ns.open_ref(f.ino)
    ns.unlink(ROOT, home.ino, "f")
    assert ns.getattr(f.ino).nlink == 0  # still there for its opener
    ns.close_ref(f.ino)
    with pytest.raises(errors.StaleHandle):
        ns.getattr(f.ino)


def test_a_last_close_that_must_not_block_frees_the_unlinked_file_in_a_thread(
    namespace, catalog, home
):
    """The NFS event loop closes a file whose cached attributes say it is still named; when an
    unlink commits between that check and the close, the close does not wait for the catalog
    on the loop: the freeing goes to a thread of its own."""
    # PostgreSQL: the cache serves nothing until the change watch listens (on a loaded machine
    # not yet when the test begins)
    assert catalog.catch_up(timeout=10), "the change signal did not come up"
    ns = namespace
    f = ns.create(ROOT, home.ino, "f")
    ns.open_ref(f.ino)
    ns.getattr(f.ino)
    assert ns.close_ref_is_cheap(f.ino)
    ns.unlink(ROOT, home.ino, "f")
    assert not ns.close_ref_is_cheap(f.ino)
    ns.invalidate()  # the attributes are not in the cache: getattr would read the catalog
    with no_blocking():
        ns.close_ref(f.ino)
    for _ in range(500):
        try:
            ns.getattr(f.ino)
        except errors.StaleHandle:
            break
        time.sleep(0.01)
    with pytest.raises(errors.StaleHandle):
        ns.getattr(f.ino)


def test_orphans_reclaimed_after_crash(namespace, catalog, home):
    ns = namespace
    f = ns.create(ROOT, home.ino, "f")
    ns.open_ref(f.ino)
    ns.unlink(ROOT, home.ino, "f")
    restarted = Namespace(catalog)  # a new process: nobody holds the file open
    assert restarted.reclaim_orphans() == 1
    with pytest.raises(errors.StaleHandle):
        restarted.getattr(f.ino)


def test_inode_numbers_never_reused(namespace, home):
    ns = namespace
    f = ns.create(ROOT, home.ino, "f")
    ns.unlink(ROOT, home.ino, "f")
    g = ns.create(ROOT, home.ino, "g")
    assert g.ino > f.ino  # an old handle can never name the new file


def test_statfs_counts_files(namespace, home):
    before = namespace.statfs()
    namespace.create(ROOT, home.ino, "f")
    after = namespace.statfs()
    assert after.free_files == before.free_files - 1 and after.name_max == 255


def test_data_calls_without_data_path_fail_clearly(namespace, home):
    f = namespace.create(ROOT, home.ino, "f")
    with pytest.raises(errors.IOFailure, match="no data path"):
        namespace.write(f.ino, 0, b"x")
    assert namespace.read(f.ino, 0, 10) == b""  # empty file: nothing to read
    d = namespace.getattr(home.ino)
    assert d.type == DIR
    with pytest.raises(errors.IsADirectory):
        namespace.read(d.ino, 0, 1)
