"""Catalog consistency check (`shingle fsck`): read-only, reports every problem found.

Checks that the namespace graph is what the namespace API maintains:
link counts match directory entries, every entry names an existing inode,
every directory has exactly one parent and is reachable from the root, a
file's extents never overlap, every extent points at an existing stripe
whose data covers it, and every stripe's live bytes are exactly the bytes its
extents reference, over every file, clone and snapshot that shares it (a stripe
nothing references should have been freed: invariant 9). A compressed stripe
names a known codec and a stored length below its data length, which its fragments can hold
(engine/coding/compression.py); a raw stripe has no stored length. Snapshot views: each
snapshot's frozen root lies in its inode range and is named in its dataset's
.snapshots directory, no two snapshots' inode ranges overlap (a clone's directories not copied
yet count the names their snapshot gives them), and the file count and
referenced bytes stored in its row (counted at create; its frozen rows never change) are what
its range holds (a lazy view, engine/namespace/lazyviews.py: its root is in one of its blocks,
its figures are what a walk through its lookup counts, lazyviews.count_space, and its folders
not copied yet count the names they will get). Quotas: each quota's usage counters equal a
recount of its tree (``shingle quota recount`` corrects them)."""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from sqlalchemy import select

from engine.catalog.database import Catalog, sql_all
from engine.catalog.models import (
    DIR,
    Dirent,
    Extent,
    Inode,
    Snapshot,
    SnapshotBlock,
    SnapshotDir,
    Stripe,
)
from engine.coding.compression import CODECS
from engine.coding.erasure import FRAGMENT_HEADER
from engine.namespace.lazyviews import LAZY_SOURCE, VIEW_PENDING, clone_pending_names
from engine.namespace.lazyviews import count_space as view_count_space
from engine.namespace.lazyviews import pending_names as view_pending_names
from engine.namespace.quotas import usage_below

INODES, DIRENTS, EXTENTS, STRIPES = (
    Inode.__table__,
    Dirent.__table__,
    Extent.__table__,
    Stripe.__table__,
)
SNAPSHOTS, SNAPDIRS, BLOCKS = Snapshot.__table__, SnapshotDir.__table__, SnapshotBlock.__table__


@dataclass
class FsckReport:
    inodes: int = 0
    dirents: int = 0
    extents: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict:
        return {
            "inodes": self.inodes,
            "dirents": self.dirents,
            "extents": self.extents,
            "clean": self.clean,
            "problems": self.problems,
        }


@dataclass
class Tables:
    """The rows a check reads, in one snapshot of the catalog."""

    inodes: dict  # ino -> (ino, type, nlink)
    dirents: list  # (parent, name, child)
    extents: list  # (ino, file_offset, length, stripe_id, stripe_offset); ino None: freeing
    stripes: dict  # stripe id -> data_length
    live: dict  # stripe id -> live_bytes
    packed: list  # compressed or stored-length stripes
    # (name, source_ino, root_ino, ino_lo, ino_hi, files, referenced_bytes), not being deleted
    snapshots: list
    snapdirs: dict  # dataset ino -> its .snapshots directory's ino
    quota_counts: list  # (quota id, root ino, (used_bytes, used_files) recorded, counted)
    # a clone's directories not copied yet: the names their snapshot gives them and the folders
    # below them, (parent, name, child, child's type), shifted into the clone; the child (and
    # below the top, the parent) maybe not copied yet (lazyclones.py)
    pending_names: list = field(default_factory=list)
    # (ino_lo, ino_hi, snapshot name, deleting, source ino, top_ino, snapshot id) of every
    # snapshot's blocks of inode numbers (top_ino not None: a lazy view, lazyviews.py)
    blocks: list = field(default_factory=list)
    # blocks of lazy views with folders not copied yet: a file's link count there counts names
    # the view may not hold (outside the dataset), so it is only checked not to fall short
    partial: list = field(default_factory=list)
    # (source ino, name) -> (files, referenced bytes) of each lazy view whose row recorded
    # them, walked through its lookup (lazyviews.count_space): a view holds more than its blocks
    walked: dict = field(default_factory=dict)


def check(
    catalog: Catalog, root_ino: int, open_inodes: set[int] | None = None, limit: int = 1000
) -> FsckReport:
    """All problems (up to ``limit``) in one snapshot of the catalog."""
    t = catalog.read(read_tables)
    report = FsckReport(len(t.inodes), len(t.dirents), len(t.extents))
    problem = report.problems.append
    for row in t.packed:
        for text in compressed_stripe_problems(row):
            problem(f"stripe {row.id}: {text}")
    names = _check_entries(t, problem)
    _check_links(t, root_ino, open_inodes or set(), names, problem)
    _check_reachable(t, root_ino, names, problem)
    _check_extents(t, report, limit)
    _check_live_bytes(t, report, limit)
    _check_snapshots_and_quotas(t, problem)
    del report.problems[limit:]
    return report


def read_tables(conn) -> Tables:
    inodes = {
        row.ino: row for row in conn.execute(select(INODES.c.ino, INODES.c.type, INODES.c.nlink))
    }
    dirents = conn.execute(select(DIRENTS.c.parent, DIRENTS.c.name, DIRENTS.c.child)).all()
    extents = conn.execute(
        select(
            EXTENTS.c.ino,
            EXTENTS.c.file_offset,
            EXTENTS.c.length,
            EXTENTS.c.stripe_id,
            EXTENTS.c.stripe_offset,
        ).order_by(EXTENTS.c.ino, EXTENTS.c.file_offset)
    ).all()
    packed = conn.execute(
        select(
            STRIPES.c.id,
            STRIPES.c.layout,
            STRIPES.c.k,
            STRIPES.c.data_length,
            STRIPES.c.fragment_length,
            STRIPES.c.compression,
            STRIPES.c.stored_length,
        ).where(STRIPES.c.compression.is_not(None) | STRIPES.c.stored_length.is_not(None))
    ).all()
    snapshots = conn.execute(
        select(
            SNAPSHOTS.c.name,
            SNAPSHOTS.c.source_ino,
            SNAPSHOTS.c.root_ino,
            SNAPSHOTS.c.ino_lo,
            SNAPSHOTS.c.ino_hi,
            SNAPSHOTS.c.files,
            SNAPSHOTS.c.referenced_bytes,
        ).where(SNAPSHOTS.c.deleting.is_(False))
    ).all()
    # a snapshot being deleted a chunk per transaction: its inodes are on their way out
    blocks = conn.execute(
        select(
            BLOCKS.c.ino_lo,
            BLOCKS.c.ino_hi,
            SNAPSHOTS.c.name,
            SNAPSHOTS.c.deleting,
            SNAPSHOTS.c.source_ino,
            SNAPSHOTS.c.top_ino,
            BLOCKS.c.snapshot_id,
        )
        .join(SNAPSHOTS, SNAPSHOTS.c.id == BLOCKS.c.snapshot_id)
        .order_by(BLOCKS.c.ino_lo)
    ).all()
    freeing = {
        ino
        for lo, hi, _name, deleting, _source, _top, _sid in blocks
        if deleting
        for ino in inodes
        if lo <= ino <= hi
    }
    # their names and link counts are half gone; their extents still count in the stripes
    dirents = [d for d in dirents if d.parent not in freeing and d.child not in freeing]
    for ino in freeing:
        del inodes[ino]
    extents = [e for e in extents if e.ino not in freeing] + [
        (None, *e[1:]) for e in extents if e.ino in freeing
    ]
    pending = sql_all(conn, "SELECT dir_ino, delta, snapshot_id FROM clone_pending")
    # a lazy view with folders not copied yet: its files' names are not all dirents yet
    partial = {int(sid) for _top, delta, sid in pending if delta == VIEW_PENDING}
    quota_counts = [
        (qid, root, (used_bytes, used_files), usage_below(conn, root))
        for qid, root, used_bytes, used_files in sql_all(
            conn, "SELECT id, root_ino, used_bytes, used_files FROM quotas ORDER BY id"
        )
    ]
    return Tables(
        inodes=inodes,
        dirents=dirents,
        extents=extents,
        stripes=dict(conn.execute(select(STRIPES.c.id, STRIPES.c.data_length)).all()),
        live=dict(conn.execute(select(STRIPES.c.id, STRIPES.c.live_bytes)).all()),
        packed=packed,
        snapshots=snapshots,
        snapdirs=dict(conn.execute(select(SNAPDIRS.c.dataset_ino, SNAPDIRS.c.dir_ino)).all()),
        quota_counts=quota_counts,
        blocks=blocks,
        pending_names=[
            (parent + delta, name, child + delta, kind)
            for top, delta, _sid in pending
            if delta not in (VIEW_PENDING, LAZY_SOURCE)
            for parent, name, child, kind in sql_all(conn, _SUBTREE_NAMES, (top - delta, DIR))
            if parent + delta == top or parent + delta not in inodes
        ]
        + [
            entry
            for top, delta, sid in pending
            if delta == VIEW_PENDING
            for entry in view_pending_names(conn, int(top), int(sid))
        ]
        + [
            entry
            for top, delta, sid in pending
            if delta == LAZY_SOURCE
            for entry in clone_pending_names(conn, int(top), int(sid))
        ],
        partial=[(lo, hi) for lo, hi, _n, _d, _s, _t, sid in blocks if sid in partial],
        walked={
            (int(source), name): view_count_space(conn, int(sid))[:2]
            for sid, source, name in sql_all(
                conn,
                "SELECT id, source_ino, name FROM snapshots WHERE top_ino IS NOT NULL "
                "AND deleting = ? AND files IS NOT NULL",
                (False,),
            )
        },
    )


# every name in the subtree of directory ? (parent, name, child, child's type)
_SUBTREE_NAMES = (
    "WITH RECURSIVE t(ino) AS (SELECT CAST(? AS BIGINT) UNION SELECT d.child FROM dirents d "
    "JOIN t ON d.parent = t.ino JOIN inodes i ON i.ino = d.child WHERE i.type = ?) "
    "SELECT d.parent, d.name, d.child, i.type FROM dirents d JOIN t ON d.parent = t.ino "
    "JOIN inodes i ON i.ino = d.child"
)


@dataclass
class Names:
    """What the directory entries say of each inode."""

    count: Counter[int] = field(default_factory=Counter)  # entries naming the inode
    subdirs: Counter[int] = field(default_factory=Counter)  # a directory's subdirectories
    parents: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))


def _check_entries(t: Tables, problem) -> Names:
    names = Names()
    inodes = t.inodes
    for parent, name, child in t.dirents:
        if parent not in inodes:
            problem(f"entry {name!r} is in missing directory {parent}")
            continue
        if inodes[parent].type != DIR:
            problem(f"entry {name!r} is in inode {parent}, which is not a directory")
        if child not in inodes:
            problem(f"entry {name!r} in directory {parent} names missing inode {child}")
            continue
        names.count[child] += 1
        if inodes[child].type == DIR:
            names.subdirs[parent] += 1
            names.parents[child].append(parent)
    for parent, _name, child, kind in t.pending_names:
        if child in inodes:  # copied through another of its names
            names.count[child] += 1
        if kind == DIR and parent in inodes:  # the pending directory's link count holds it
            names.subdirs[parent] += 1
        if kind == DIR and child in inodes:  # a lazy view's folder copied before its parent
            names.parents[child].append(parent)
    return names


def _check_links(t: Tables, root_ino: int, open_inodes: set[int], names: Names, problem):
    for ino, row in t.inodes.items():
        if row.type == DIR:
            want = 2 + names.subdirs[ino] if (ino == root_ino or names.count[ino]) else 0
            if ino != root_ino and len(names.parents[ino]) != 1:
                problem(f"directory {ino} has {len(names.parents[ino])} parents, expected 1")
        else:
            want = names.count[ino]
            if row.nlink > want and _in_blocks(t.partial, ino):
                want = row.nlink  # names outside the dataset count until the view is whole
        if row.nlink != want:
            problem(f"inode {ino} has nlink {row.nlink}, but {want} entries refer to it")
        if want == 0 and ino != root_ino and ino not in open_inodes:
            problem(f"inode {ino} has no name and is not open (orphan)")


def _in_blocks(blocks: list, ino: int) -> bool:
    return any(lo <= ino <= hi for lo, hi in blocks)


def _check_reachable(t: Tables, root_ino: int, names: Names, problem) -> None:
    reachable = {root_ino}
    children = defaultdict(list)
    for parent, _, child in t.dirents:
        if child in t.inodes and t.inodes[child].type == DIR:
            children[parent].append(child)
    for parent, _, child, kind in t.pending_names:  # through folders not copied yet
        if kind == DIR:
            children[parent].append(child)
    todo = [root_ino]
    while todo:
        for child in children[todo.pop()]:
            if child not in reachable:
                reachable.add(child)
                todo.append(child)
    for ino, row in t.inodes.items():
        if row.type == DIR and names.count[ino] and ino not in reachable:
            problem(f"directory {ino} is not reachable from the root (a cycle)")


def _check_extents(t: Tables, report: FsckReport, limit: int) -> None:
    problem = report.problems.append
    last_end: dict[int, int] = {}
    for ino, offset, length, stripe_id, stripe_offset in t.extents:
        if ino is None:  # of a snapshot being deleted: counted in its stripe, nothing else
            continue
        if ino not in t.inodes:
            problem(f"extent at {offset} belongs to missing inode {ino}")
        if length <= 0:
            problem(f"extent of inode {ino} at {offset} has length {length}")
        if offset < last_end.get(ino, 0):
            problem(f"extents of inode {ino} overlap at offset {offset}")
        last_end[ino] = offset + length
        data_length = t.stripes.get(stripe_id)
        if data_length is None:
            problem(f"extent of inode {ino} at {offset} points at missing stripe {stripe_id}")
        elif stripe_offset + length > data_length:
            problem(f"extent of inode {ino} at {offset} reads past the end of stripe {stripe_id}")
        if len(report.problems) >= limit:
            break


def _check_live_bytes(t: Tables, report: FsckReport, limit: int) -> None:
    referenced: Counter = Counter()
    for _ino, _offset, length, stripe_id, _so in t.extents:
        referenced[stripe_id] += length
    for stripe_id, live_bytes in t.live.items():
        if len(report.problems) >= limit:
            break
        if referenced[stripe_id] == 0:
            report.problems.append(
                f"stripe {stripe_id} is referenced by no extent but was not freed"
            )
        elif live_bytes != referenced[stripe_id]:
            report.problems.append(
                f"stripe {stripe_id} counts {live_bytes} live bytes, its extents reference "
                f"{referenced[stripe_id]}"
            )


def _check_snapshots_and_quotas(t: Tables, problem) -> None:
    named = {(parent, child) for parent, _name, child in t.dirents}
    for name, source, root, lo, hi, _files, _referenced in t.snapshots:
        if not lo <= root <= hi and lo != hi:  # lo = hi = root: a lazy view (blocks checked)
            problem(f"snapshot {name!r} of inode {source}: root {root} outside [{lo}, {hi}]")
        if (t.snapdirs.get(source), root) not in named:
            problem(f"snapshot {name!r} of inode {source} is not named in its .snapshots")
    _check_snapshot_ranges(t, problem)
    for qid, root, recorded, counted in t.quota_counts:
        if recorded != counted:
            problem(
                f"quota {qid} of directory {root} counts {recorded[0]} bytes and {recorded[1]} "
                f"files, its tree holds {counted[0]} bytes and {counted[1]} files"
            )


def _check_snapshot_ranges(t: Tables, problem) -> None:
    """Snapshots' inode ranges and blocks are disjoint, a snapshot's range is its one block,
    and each holds the files and referenced bytes its row recorded (NULL: not counted yet,
    nothing to compare)."""
    inos = sorted(t.inodes)
    by_ino: dict[int, int] = defaultdict(int)
    for ino, _offset, length, _stripe, _at in t.extents:
        if ino is not None:
            by_ino[ino] += length
    extent_inos = sorted(by_ino)
    # blocks: disjoint, and a snapshot copied whole has one, its range (no inode of it outside);
    # a lazy view's are handed out as it copies (lazyviews.py)
    previous = None
    mine: dict[tuple[int, str], list] = defaultdict(list)
    lazy = set()
    for lo, hi, name, deleting, source, top, _sid in t.blocks:
        if not deleting:
            mine[(source, name)].append((lo, hi))
            if top is not None:
                lazy.add((source, name))
    for lo, hi, name, *_rest in t.blocks:
        if previous is not None and lo <= previous[1]:
            problem(
                f"snapshot {name!r}: inode block [{lo}, {hi}] overlaps a block of {previous[0]!r}"
            )
        previous = (name, hi)
    previous = None
    for name, source, _root, lo, hi, *_figures in sorted(t.snapshots, key=lambda r: r[3]):
        if (source, name) in lazy:
            continue
        if previous is not None and lo <= previous[1]:
            problem(
                f"snapshot {name!r} of inode {source}: inodes [{lo}, {hi}] overlap those of "
                f"{previous[0]!r}"
            )
        previous = (name, hi)
    for name, source, root, lo, hi, files, referenced in t.snapshots:
        blocks = mine[(source, name)]
        if (source, name) in lazy:  # its figures are a walk through its lookup
            if not any(b_lo <= root <= b_hi for b_lo, b_hi in blocks):
                problem(f"snapshot {name!r} of inode {source}: root {root} in none of its blocks")
            _check_walked(t.walked.get((source, name)), name, source, (files, referenced), problem)
            continue
        if blocks != [(lo, hi)]:
            problem(
                f"snapshot {name!r} of inode {source}: its range [{lo}, {hi}] is not its one "
                "block of inode numbers"
            )
        index = (inos, by_ino, extent_inos)
        _check_held(index, name, source, [(lo, hi)], (files, referenced), problem)


def _check_walked(walked, name, source, figures, problem) -> None:
    """A lazy view's recorded files and referenced bytes are what a walk of it counts."""
    if walked is not None and walked != figures:
        problem(
            f"snapshot {name!r} of inode {source} recorded {figures[0]} inodes and "
            f"{figures[1]} referenced bytes, its view holds {walked[0]} and {walked[1]}"
        )


def _check_held(index, name, source, spans, figures, problem) -> None:
    """The files and referenced bytes a whole copy's row recorded are what its range holds
    (even if its block is wrong: reported apart)."""
    inos, by_ino, extent_inos = index
    files, referenced = figures
    held = counted = 0
    for b_lo, b_hi in spans:
        held += bisect.bisect_right(inos, b_hi) - bisect.bisect_left(inos, b_lo)
        first = bisect.bisect_left(extent_inos, b_lo)
        last = bisect.bisect_right(extent_inos, b_hi)
        counted += sum(by_ino[ino] for ino in extent_inos[first:last])
    if files is not None and held != files:
        problem(
            f"snapshot {name!r} of inode {source} recorded {files} inodes, its range holds {held}"
        )
    if referenced is not None and counted != referenced:
        problem(
            f"snapshot {name!r} of inode {source} recorded {referenced} referenced bytes, "
            f"its extents reference {counted}"
        )


def compressed_stripe_problems(row) -> list[str]:
    """What is wrong with a stripe row's compression columns (codec, stored length)."""
    if row.compression is None:
        return [f"stored length {row.stored_length} recorded for a raw stripe"]
    if row.compression not in CODECS:
        return [f"unknown compression {row.compression!r}, expected one of {CODECS}"]
    if row.stored_length is None or not 0 < row.stored_length < row.data_length:
        return [
            f"compressed ({row.compression}) with stored length {row.stored_length}, expected "
            f"1 to {row.data_length - 1} (below its {row.data_length} data bytes)"
        ]
    header = FRAGMENT_HEADER if row.layout == "ec" else 0
    holds = (row.fragment_length - header) * (row.k if row.layout == "ec" else 1)
    if holds < row.stored_length:
        return [
            f"its fragments hold {holds} bytes, fewer than the {row.stored_length} compressed "
            "bytes recorded"
        ]
    return []
