"""Snapshots taken in constant time (issue 35; docs/snapshots.md "The lookup order"): a
snapshot records its id and ``top_ino``; a live inode's rows (or a directory's names) are copied
into the NEWEST snapshot of each dataset chain that holds it, before they change, in the
change's own transaction; a view reads, for live inode x, the first copy found from its own
snapshot to the newest, else the live rows.

Switched off on main (``ENABLED``): create copies whole unless it is on (or asked with
``whole=False``), and the namespace's copy-up (ReadOnlyViews.preserve) does nothing. A view folder's
first read materialises it (``materialize``, through lazyclones.materialize); the space is counted
through the lookup (``count_space``); a clone of a view copies its folders from the lookup
(``clone_root``, ``clone_materialize``); a deleted view hands its copies down before its reclaim
(``hand_down``); the snapshot service's other whole-view readers call ``materialize_all`` first."""

from __future__ import annotations

from engine.catalog.database import in_list, sql, sql_all, sql_one
from engine.catalog.models import DIR
from engine.datapath.accounting import chunks
from engine.datapath.sharing import add_counts

# an inode row's columns but its number (copied as they are)
INODE_COLUMNS = (
    "generation, type, mode, uid, gid, size, nlink, rdev, atime_ns, mtime_ns, "
    "ctime_ns, btime_ns, change, band_class"
)

# whether create makes lazy views and live changes copy up (ReadOnlyViews.preserve); off on
# main (docs/snapshots.md "Step 2c on main": what keeps it off), so that no change pays for
# chains that cannot exist (tests of lazy views and bench/snapshots.py --lazy switch it on)
ENABLED = False

# a view directory waiting for its names is a clone_pending row with this delta (a clone's
# delta is never 0: its numbers lie above its snapshot's)
VIEW_PENDING = 0
# a folder of a clone of a lazy view waiting for its names: its source is the live folder its
# ``clone_inodes`` row names, read through the view's lookup (a shift has no range to cover)
LAZY_SOURCE = -1


def chains(conn) -> dict[int, list[tuple[int, int, bool]]]:
    """dataset ino -> [(snapshot id, top_ino, being deleted)] of its lazy snapshots, oldest
    first. A deleted snapshot stays in its chain until reclaimed: older ones may read its
    copies (docs/snapshots.md, "The lookup order")."""
    out: dict[int, list[tuple[int, int, bool]]] = {}
    for sid, source, top, deleting in sql_all(
        conn,
        "SELECT id, source_ino, top_ino, deleting FROM snapshots WHERE top_ino IS NOT NULL "
        "ORDER BY id",
    ):
        out.setdefault(int(source), []).append((int(sid), int(top), bool(deleting)))
    return out


def allocate(conn, sid: int, count: int) -> list[int]:
    """``count`` new inode numbers for snapshot ``sid``, recorded as its blocks (the last one
    extended when the numbers follow it)."""
    if count <= 0:
        return []
    if conn.dialect.name == "sqlite":
        top = max(
            sql_one(conn, "SELECT COALESCE(MAX(ino), 0) FROM inodes")[0],
            (sql_one(conn, "SELECT seq FROM sqlite_sequence WHERE name = 'inodes'") or (0,))[0],
        )
        numbers = list(range(int(top) + 1, int(top) + 1 + count))
        # AUTOINCREMENT remembers the largest number inserted: the rows follow at once
        sql(
            conn,
            "UPDATE sqlite_sequence SET seq = ? WHERE name = 'inodes' AND seq < ?",
            (numbers[-1], numbers[-1]),
        ).close()
    else:
        seq = sql_one(conn, "SELECT pg_get_serial_sequence('inodes', 'ino')")[0]
        numbers = [
            int(r[0])
            for r in sql_all(
                conn, "SELECT nextval(?::regclass) FROM generate_series(1, ?)", (seq, count)
            )
        ]
    runs: list[list[int]] = []
    for n in sorted(numbers):
        if runs and runs[-1][1] + 1 == n:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    last = sql_one(
        conn,
        "SELECT ino_lo, ino_hi FROM snapshot_blocks WHERE snapshot_id = ? "
        "ORDER BY ino_lo DESC LIMIT 1",
        (sid,),
    )
    for lo, hi in runs:
        if last is not None and int(last[1]) + 1 == lo:
            sql(
                conn, "UPDATE snapshot_blocks SET ino_hi = ? WHERE ino_lo = ?", (hi, last[0])
            ).close()
            last = (last[0], hi)
            continue
        sql(
            conn,
            "INSERT INTO snapshot_blocks (ino_lo, ino_hi, snapshot_id) VALUES (?, ?, ?)",
            (lo, hi, sid),
        ).close()
        last = (lo, hi)
    return numbers


def _copy_inode(conn, source: int, target: int) -> None:
    """Inode ``source``'s rows (inode, symlink, xattrs, extents counted in their stripes) at
    number ``target``."""
    sql(
        conn,
        f"INSERT INTO inodes (ino, {INODE_COLUMNS}) SELECT ?, {INODE_COLUMNS} FROM inodes "
        "WHERE ino = ?",
        (target, source),
    ).close()
    for table, columns in (("symlinks", "target"), ("xattrs", "name, value")):
        sql(
            conn,
            f"INSERT INTO {table} (ino, {columns}) SELECT ?, {columns} FROM {table} WHERE ino = ?",
            (target, source),
        ).close()
    sql(
        conn,
        "INSERT INTO extents (ino, file_offset, length, stripe_id, stripe_offset) "
        "SELECT ?, file_offset, length, stripe_id, stripe_offset FROM extents WHERE ino = ?",
        (target, source),
    ).close()
    add_counts(conn, "ino = ?", (target,))


def _view_of(conn, sid: int, x: int) -> tuple[int, bool, bool] | None:
    """(view ino, rows copied, names copied) of live ``x`` in snapshot ``sid``, None: no number."""
    row = sql_one(
        conn,
        "SELECT m.view_ino, i.ino, m.names_copied FROM snapshot_inodes m LEFT JOIN inodes i "
        "ON i.ino = m.view_ino WHERE m.snapshot_id = ? AND m.live_ino = ?",
        (sid, x),
    )
    if row is None:
        return None
    return int(row[0]), row[1] is not None, bool(row[2])


def _numbered(conn, sid: int, x: int) -> tuple[int, bool, bool]:
    """``_view_of``, with a number handed out (rows and names not copied) when ``x`` has none."""
    view = _view_of(conn, sid, x)
    if view is None:
        [number] = allocate(conn, sid, 1)
        sql(
            conn,
            "INSERT INTO snapshot_inodes (snapshot_id, live_ino, view_ino, names_copied) "
            "VALUES (?, ?, ?, ?)",
            (sid, x, number, False),
        ).close()
        view = (number, False, False)
    return view


def first_copy(conn, sids: list[int], x: int) -> int | None:
    """The view ino holding ``x``'s rows as the first of ``sids`` (a chain from one snapshot
    to the newest) holds them: the first snapshot with a copy; None: the live rows."""
    if not sids:
        return None
    rows = dict(
        sql_all(
            conn,
            "SELECT m.snapshot_id, m.view_ino FROM snapshot_inodes m JOIN inodes i "
            f"ON i.ino = m.view_ino WHERE m.live_ino = ? AND m.snapshot_id IN {in_list(sids)}",
            (x, *sids),
        )
    )
    for sid in sids:
        if sid in rows:
            return int(rows[sid])
    return None


def _names_from(conn, sids: list[int], d: int) -> int | None:
    """The snapshot whose copy of ``d``'s names the first of ``sids`` reads; None: live."""
    if not sids:
        return None
    row = sql_one(
        conn,
        "SELECT MIN(snapshot_id) FROM snapshot_inodes WHERE live_ino = ? AND names_copied = ? "
        f"AND snapshot_id IN {in_list(sids)}",
        (d, True, *sids),
    )
    return None if row[0] is None else int(row[0])


def names_at(conn, sids: list[int], d: int) -> list[tuple[str, int]]:
    """(name, live child) of directory ``d`` as the first of ``sids`` holds them."""
    sid = _names_from(conn, sids, d)
    if sid is not None:
        rows = sql_all(
            conn,
            "SELECT name, child FROM snapshot_names WHERE snapshot_id = ? AND parent = ?",
            (sid, d),
        )
    else:
        rows = sql_all(
            conn,
            "SELECT name, child FROM dirents WHERE parent = ? "
            "AND child NOT IN (SELECT dir_ino FROM snapshot_dirs)",
            (d,),
        )
    return sorted((str(n), int(c)) for n, c in rows)


def _names_child(conn, sids: list[int], d: int, x: int) -> bool:
    """Whether directory ``d`` has a name for ``x`` as the first of ``sids`` holds them."""
    sid = _names_from(conn, sids, d)
    if sid is not None:
        return (
            sql_one(
                conn,
                "SELECT 1 FROM snapshot_names WHERE snapshot_id = ? AND parent = ? AND child = ?",
                (sid, d, x),
            )
            is not None
        )
    return sql_one(conn, "SELECT 1 FROM dirents WHERE parent = ? AND child = ?", (d, x)) is not None


def holds(conn, dataset: int, sids: list[int], top: int, x: int) -> bool:
    """Whether the first of ``sids`` (with ``top_ino`` ``top``) holds live inode ``x``: one of
    x's names at its create lay in ``dataset``'s tree. Candidates for the parent are x's live
    parents and the copied names naming x; a name counts if the directory held it then."""
    seen: set[int] = set()
    todo = [x]
    while todo:
        ino = todo.pop()
        if ino == dataset:
            return True
        if ino > top or ino in seen:
            continue
        seen.add(ino)
        parents = {
            int(r[0]) for r in sql_all(conn, "SELECT parent FROM dirents WHERE child = ?", (ino,))
        }
        parents |= {
            int(r[0])
            for r in sql_all(
                conn,
                f"SELECT parent FROM snapshot_names WHERE child = ? AND snapshot_id IN "
                f"{in_list(sids)}",
                (ino, *sids),
            )
        }
        todo += [p for p in parents if p <= top and _names_child(conn, sids, p, ino)]
    return False


def copy_up(conn, x: int, *, names: bool | None = None, known=None) -> int:
    """Before live inode ``x``'s rows (``names``: and its names; None: if it is a directory)
    change: for each dataset chain (``known``: as ``chains(conn)`` reads them), the newest
    snapshot that holds ``x`` gets a copy if it has none. Returns the copies made."""
    made = 0
    if names is None:  # a directory's names may be what changes
        kind = sql_one(conn, "SELECT type FROM inodes WHERE ino = ?", (x,))
        names = kind is not None and kind[0] == DIR
    for dataset, chain in (chains(conn) if known is None else known).items():
        if x > chain[-1][1]:
            continue  # numbered after every snapshot of the chain
        sids = [sid for sid, _top, _deleting in chain]
        for k in range(len(chain) - 1, -1, -1):
            # the newest snapshot not being deleted that holds x
            if not chain[k][2] and holds(conn, dataset, sids[k:], chain[k][1], x):
                break
        else:
            continue
        sid = sids[k]
        view = _numbered(conn, sid, x)
        # what the snapshot reads now: a newer snapshot being deleted may hold a copy (x changed
        # after it was taken), which is this one's state too; else the live rows
        if not view[1]:
            source = first_copy(conn, sids[k:], x)
            _copy_inode(conn, x if source is None else source, view[0])
            made += 1
        if names and not view[2]:
            held = _names_from(conn, sids[k:], x)
            if held is not None:
                sql(
                    conn,
                    "INSERT INTO snapshot_names (snapshot_id, parent, name, child) "
                    "SELECT ?, parent, name, child FROM snapshot_names WHERE snapshot_id = ? "
                    "AND parent = ?",
                    (sid, held, x),
                ).close()
            else:
                sql(
                    conn,
                    "INSERT INTO snapshot_names (snapshot_id, parent, name, child) "
                    "SELECT ?, parent, name, child FROM dirents WHERE parent = ? "
                    "AND child NOT IN (SELECT dir_ino FROM snapshot_dirs)",
                    (sid, x),
                ).close()
            sql(
                conn,
                "UPDATE snapshot_inodes SET names_copied = ? WHERE snapshot_id = ? "
                "AND live_ino = ?",
                (True, sid, x),
            ).close()
            made += 1
    return made


def create(conn, dataset: int, snapshot_id: int) -> int:
    """Record lazy snapshot ``snapshot_id`` of ``dataset`` (its row inserted, ``top_ino`` set):
    its root's number, the root's row (no .snapshots in it), pending. Returns the root."""
    [root] = allocate(conn, snapshot_id, 1)
    sql(
        conn,
        "INSERT INTO snapshot_inodes (snapshot_id, live_ino, view_ino, names_copied) "
        "VALUES (?, ?, ?, ?)",
        (snapshot_id, dataset, root, False),
    ).close()
    _copy_inode(conn, dataset, root)
    sql(conn, "UPDATE inodes SET nlink = nlink - 1 WHERE ino = ?", (root,)).close()
    sql(
        conn,
        "INSERT INTO clone_pending (dir_ino, delta, snapshot_id) VALUES (?, ?, ?)",
        (root, VIEW_PENDING, snapshot_id),
    ).close()
    return root


def materialize(conn, view_dir: int, sid: int) -> list[int]:
    """Copy view directory ``view_dir`` of snapshot ``sid``: its names as the snapshot holds
    them, each child numbered in the snapshot and its rows copied as the snapshot holds them;
    returns the child directories, now pending."""
    sids = _chain_from(conn, sid)
    d = int(sql_one(conn, _LIVE_OF, (view_dir,))[0])
    pending = []
    for name, child in names_at(conn, sids, d):
        view = _numbered(conn, sid, child)
        if not view[1]:
            source = first_copy(conn, sids, child)
            _copy_inode(conn, child if source is None else source, view[0])
            if child in {
                int(r[0]) for r in sql_all(conn, "SELECT dataset_ino FROM snapshot_dirs")
            }:  # a dataset inside: no .snapshots in the view
                sql(conn, "UPDATE inodes SET nlink = nlink - 1 WHERE ino = ?", (view[0],)).close()
        kind = sql_one(conn, "SELECT type FROM inodes WHERE ino = ?", (view[0],))[0]
        if kind == DIR:  # copied up or not, its names are not in the view yet
            sql(
                conn,
                "INSERT INTO clone_pending (dir_ino, delta, snapshot_id) VALUES (?, ?, ?)",
                (view[0], VIEW_PENDING, sid),
            ).close()
            pending.append(view[0])
        sql(
            conn,
            "INSERT INTO dirents (parent, name, child) VALUES (?, ?, ?)",
            (view_dir, name, view[0]),
        ).close()
    sql(conn, "DELETE FROM clone_pending WHERE dir_ino = ?", (view_dir,)).close()
    return pending


def _chain_from(conn, sid: int) -> list[int]:
    """Snapshot ``sid`` and the newer lazy snapshots of its dataset: where its lookups read."""
    (dataset,) = sql_one(conn, "SELECT source_ino FROM snapshots WHERE id = ?", (sid,))
    return [
        int(r[0])
        for r in sql_all(
            conn,
            "SELECT id FROM snapshots WHERE source_ino = ? AND top_ino IS NOT NULL AND id >= ? "
            "ORDER BY id",
            (dataset, sid),
        )
    ]


def pending_names(conn, view_dir: int, sid: int) -> list[tuple[int, str, int, int]]:
    """The names pending view folder ``view_dir`` of snapshot ``sid`` will hold, and those of
    the folders below it not numbered yet, as (parent, name, child, child's type), read only
    (fsck): parent and child are view numbers where copied, else minus the live number."""
    sids = _chain_from(conn, sid)
    pending = {int(r[0]) for r in sql_all(conn, "SELECT dir_ino FROM clone_pending")}
    out = []
    todo = [(view_dir, int(sql_one(conn, _LIVE_OF, (view_dir,))[0]))]
    while todo:
        parent, d = todo.pop()
        for name, child in names_at(conn, sids, d):
            view = _view_of(conn, sid, child)
            number = view[0] if view is not None and view[1] else -child
            source = first_copy(conn, sids, child) if number < 0 else number
            row = sql_one(conn, "SELECT type FROM inodes WHERE ino = ?", (source or child,))
            kind = int(row[0]) if row is not None else 0
            out.append((parent, name, number, kind))
            # a folder below that is not pending itself was never materialised (its parent
            # was not): its names are still to come, under its copy or its live number
            if kind == DIR and number not in pending:
                todo.append((number, child))
    return out


_LIVE_OF = "SELECT live_ino FROM snapshot_inodes WHERE view_ino = ?"


def count_links(conn, sid: int) -> None:
    """A whole view's files' link counts are the names it holds (a live file's names outside
    the dataset stay out), as a copy made at create counts them."""
    for lo, hi in sql_all(
        conn, "SELECT ino_lo, ino_hi FROM snapshot_blocks WHERE snapshot_id = ?", (sid,)
    ):
        count_links_between(conn, int(lo), int(hi))


def count_links_between(conn, lo: int, hi: int) -> None:
    """Copied files numbered ``lo``..``hi``: their links are the names the copy holds."""
    sql(
        conn,
        "UPDATE inodes SET nlink = (SELECT COUNT(*) FROM dirents WHERE child = inodes.ino) "
        "WHERE ino BETWEEN ? AND ? AND type <> ? AND nlink > 1",
        (lo, hi, DIR),
    ).close()


def materialize_all(conn, sid: int) -> int:
    """Every pending directory of snapshot ``sid``'s view; returns how many."""
    done = 0
    while True:
        rows = sql_all(
            conn,
            "SELECT dir_ino FROM clone_pending WHERE snapshot_id = ? AND delta = ? LIMIT 256",
            (sid, VIEW_PENDING),
        )
        if not rows:
            if done:
                count_links(conn, sid)
            return done
        for (ino,) in rows:
            materialize(conn, int(ino), sid)
            done += 1


class CopyUpWatch:
    """The data path's size watch: a commit's files are copied up before their extents and
    sizes change (Committer._record calls ``before`` inside its transaction)."""

    def __init__(self, readonly):
        self.readonly = readonly

    def before(self, conn, inos) -> None:
        self.readonly.preserve(conn, *inos)

    def after(self, conn, state) -> None:
        pass


def count_space(conn, sid: int) -> tuple[int, int, int, int]:
    """(files, referenced, unique, shared bytes) of lazy snapshot ``sid``'s view, read through
    its lookup without copying anything: a walk of its names (a few reads per folder, whatever
    is copied so far: a view's copies hold what it held, so the walk reads the same tree at any
    time). A file of several names counts once. Unique bytes are those of stripes that only the
    view's own copies reference (what its reclaim frees); shared, its references into every
    other stripe (live files read through, other snapshots' copies, clones)."""
    sids = _chain_from(conn, sid)
    (dataset,) = sql_one(conn, "SELECT source_ino FROM snapshots WHERE id = ?", (sid,))
    root_copy = first_copy(conn, sids, int(dataset))
    sources = {int(dataset): int(dataset) if root_copy is None else root_copy}
    todo = [int(dataset)]
    while todo:
        d = todo.pop()
        children = [c for _name, c in names_at(conn, sids, d) if c not in sources]
        for part in chunks(sorted(set(children))):
            # the first copy of each child from this snapshot to the newest, else its live rows
            copies: dict[int, dict[int, int]] = {}
            for live, s, view in sql_all(
                conn,
                "SELECT m.live_ino, m.snapshot_id, m.view_ino FROM snapshot_inodes m JOIN inodes "
                f"i ON i.ino = m.view_ino WHERE m.live_ino IN {in_list(part)} AND m.snapshot_id "
                f"IN {in_list(sids)}",
                (*part, *sids),
            ):
                copies.setdefault(int(live), {})[int(s)] = int(view)
            found = {}
            for c in part:
                held = copies.get(c, {})
                found[c] = next((held[s] for s in sids if s in held), c)
            kinds = dict(
                sql_all(
                    conn,
                    f"SELECT ino, type FROM inodes WHERE ino IN {in_list(list(found.values()))}",
                    tuple(found.values()),
                )
            )
            for c, source in found.items():
                sources[c] = source
                if kinds.get(source) == DIR:
                    todo.append(c)
    refs: dict[int, int] = {}
    sourced = sorted(set(sources.values()))
    for part in chunks(sourced):
        for stripe, length in sql_all(
            conn,
            f"SELECT stripe_id, SUM(length) FROM extents WHERE ino IN {in_list(part)} "
            "GROUP BY stripe_id",
            tuple(part),
        ):
            refs[int(stripe)] = refs.get(int(stripe), 0) + int(length)
    # the view's own copies (its blocks) against each stripe's whole count
    own = dict(
        sql_all(
            conn,
            "SELECT e.stripe_id, SUM(e.length) FROM extents e JOIN snapshot_blocks b "
            "ON e.ino BETWEEN b.ino_lo AND b.ino_hi WHERE b.snapshot_id = ? GROUP BY e.stripe_id",
            (sid,),
        )
    )
    unique = shared = 0
    for part in chunks(sorted(refs)):
        for stripe, live, length in sql_all(
            conn,
            f"SELECT id, live_bytes, data_length FROM stripes WHERE id IN {in_list(part)}",
            tuple(part),
        ):
            if own.get(stripe) == live:
                unique += min(int(live), int(length))
            else:
                shared += refs[int(stripe)]
    return len(sources), sum(refs.values()), unique, shared


HAND_DOWN_BATCH = 256  # copies of a deleted view handed down per transaction


def hand_down(conn, sid: int, after: int = 0, limit: int = HAND_DOWN_BATCH) -> int | None:
    """Before deleted lazy snapshot ``sid``'s rows are freed: each of its copies (of an inode's
    rows, of a folder's names), taken in live-number order from above ``after``, goes to the
    newest older live snapshot of its chain that holds the item and reads this copy (no copy of
    its own, none in a snapshot between): what ``sid`` held of x is what that one holds, since
    it read it here. Returns the last live number handled (the next call's ``after``), None
    when none is left. Idempotent: a copy handed down stops the next search."""
    rows = sql_all(
        conn,
        "SELECT m.live_ino, m.view_ino, m.names_copied, i.ino FROM snapshot_inodes m "
        "LEFT JOIN inodes i ON i.ino = m.view_ino WHERE m.snapshot_id = ? AND m.live_ino > ? "
        "ORDER BY m.live_ino LIMIT ?",
        (sid, after, limit),
    )
    if not rows:
        return None
    (dataset,) = sql_one(conn, "SELECT source_ino FROM snapshots WHERE id = ?", (sid,))
    chain = chains(conn).get(int(dataset), [])
    sids = [s for s, _top, _deleting in chain]
    if sid not in sids:
        return None
    at = sids.index(sid)
    older = list(reversed(list(enumerate(chain[:at]))))
    for x, v, names, copied in rows:
        x = int(x)
        if copied is not None:
            for i, (s, top, deleting) in older:
                if x > top:
                    break  # older snapshots have lower tops: x is in none of them
                view = _view_of(conn, s, x)
                if view is not None and view[1]:
                    break  # it reads its own copy, and the older ones read it or theirs
                if not deleting and holds(conn, int(dataset), sids[i:], top, x):
                    number = _numbered(conn, s, x)[0]
                    _copy_inode(conn, int(v), number)
                    break
        if names:
            for i, (s, top, deleting) in older:
                if x > top:
                    break
                view = _view_of(conn, s, x)
                if view is not None and view[2]:
                    break
                if not deleting and holds(conn, int(dataset), sids[i:], top, x):
                    _numbered(conn, s, x)
                    sql(
                        conn,
                        "INSERT INTO snapshot_names (snapshot_id, parent, name, child) "
                        "SELECT ?, parent, name, child FROM snapshot_names WHERE snapshot_id = ? "
                        "AND parent = ?",
                        (s, sid, x),
                    ).close()
                    sql(
                        conn,
                        "UPDATE snapshot_inodes SET names_copied = ? WHERE snapshot_id = ? "
                        "AND live_ino = ?",
                        (True, s, x),
                    ).close()
                    break
    return int(rows[-1][0])


def _copy_new(conn, source: int) -> int:
    """Inode ``source``'s rows (as ``_copy_inode``) at a new live number; returns it."""
    (number,) = sql_one(
        conn,
        f"INSERT INTO inodes ({INODE_COLUMNS}) SELECT {INODE_COLUMNS} FROM inodes WHERE ino = ? "
        "RETURNING ino",
        (source,),
    )
    number = int(number)
    for table, columns in (("symlinks", "target"), ("xattrs", "name, value")):
        sql(
            conn,
            f"INSERT INTO {table} (ino, {columns}) SELECT ?, {columns} FROM {table} WHERE ino = ?",
            (number, source),
        ).close()
    sql(
        conn,
        "INSERT INTO extents (ino, file_offset, length, stripe_id, stripe_offset) "
        "SELECT ?, file_offset, length, stripe_id, stripe_offset FROM extents WHERE ino = ?",
        (number, source),
    ).close()
    add_counts(conn, "ino = ?", (number,))
    return number


def clone_root(conn, sid: int) -> int:
    """A clone of lazy snapshot ``sid``'s view: its root (a copy of the view's root row) at a new
    live number, pending; nothing else copied. Returns the root."""
    (dataset, view_root) = sql_one(
        conn, "SELECT source_ino, root_ino FROM snapshots WHERE id = ?", (sid,)
    )
    root = _copy_new(conn, int(view_root))
    sql(
        conn,
        "INSERT INTO clone_inodes (clone_ino, clone_root, source_ino) VALUES (?, ?, ?)",
        (root, root, int(dataset)),
    ).close()
    sql(
        conn,
        "INSERT INTO clone_pending (dir_ino, delta, snapshot_id) VALUES (?, ?, ?)",
        (root, LAZY_SOURCE, sid),
    ).close()
    return root


def _datasets(conn) -> set[int]:
    return {int(r[0]) for r in sql_all(conn, "SELECT dataset_ino FROM snapshot_dirs")}


def view_links(conn, sid: int, x: int) -> int:
    """How many names live inode ``x`` has in lazy snapshot ``sid``'s view (its names outside
    the dataset, or added since, are not the view's): the candidates are x's live parents and
    the copied names naming it, each counted if the view holds the folder and its name."""
    sids = _chain_from(conn, sid)
    dataset, top = sql_one(conn, "SELECT source_ino, top_ino FROM snapshots WHERE id = ?", (sid,))
    parents = {int(r[0]) for r in sql_all(conn, "SELECT parent FROM dirents WHERE child = ?", (x,))}
    parents |= {
        int(r[0])
        for r in sql_all(
            conn,
            f"SELECT parent FROM snapshot_names WHERE child = ? AND snapshot_id IN {in_list(sids)}",
            (x, *sids),
        )
    }
    links = 0
    for p in parents:
        if p <= int(top) and holds(conn, int(dataset), sids, int(top), p):
            links += sum(1 for _name, c in names_at(conn, sids, p) if c == x)
    return links


def clone_materialize(conn, dir_ino: int, sid: int) -> list[int]:
    """Copy pending folder ``dir_ino`` of a clone of lazy snapshot ``sid``: its names as the
    view holds its source folder (read through the lookup: nothing of the view is copied), each
    child copied from what the view reads at a new number, or the one the clone gave it through
    another name; returns the child folders, now pending."""
    root, d = (int(v) for v in sql_one(conn, _CLONE_SOURCE, (dir_ino,)))
    sids = _chain_from(conn, sid)
    nested = _datasets(conn)
    pending = []
    for name, child in names_at(conn, sids, d):
        row = sql_one(
            conn,
            "SELECT clone_ino FROM clone_inodes WHERE clone_root = ? AND source_ino = ?",
            (root, child),
        )
        if row is None:
            source = first_copy(conn, sids, child)
            number = _copy_new(conn, child if source is None else source)
            sql(
                conn,
                "INSERT INTO clone_inodes (clone_ino, clone_root, source_ino) VALUES (?, ?, ?)",
                (number, root, child),
            ).close()
            kind, nlink = sql_one(conn, "SELECT type, nlink FROM inodes WHERE ino = ?", (number,))
            if kind == DIR:
                if child in nested:  # a dataset inside: no .snapshots in the clone
                    sql(
                        conn, "UPDATE inodes SET nlink = nlink - 1 WHERE ino = ?", (number,)
                    ).close()
                sql(
                    conn,
                    "INSERT INTO clone_pending (dir_ino, delta, snapshot_id) VALUES (?, ?, ?)",
                    (number, LAZY_SOURCE, sid),
                ).close()
                pending.append(number)
            elif nlink > 1:  # names outside the dataset are not the clone's
                sql(
                    conn,
                    "UPDATE inodes SET nlink = ? WHERE ino = ?",
                    (view_links(conn, sid, child), number),
                ).close()
        else:
            number = int(row[0])
        sql(
            conn,
            "INSERT INTO dirents (parent, name, child) VALUES (?, ?, ?)",
            (dir_ino, name, number),
        ).close()
    sql(conn, "DELETE FROM clone_pending WHERE dir_ino = ?", (dir_ino,)).close()
    return pending


_CLONE_SOURCE = "SELECT clone_root, source_ino FROM clone_inodes WHERE clone_ino = ?"


def clone_pending_names(conn, dir_ino: int, sid: int) -> list[tuple[int, str, int, int]]:
    """``pending_names`` for pending folder ``dir_ino`` of a clone of lazy view ``sid`` (read
    only, fsck): parent and child are clone numbers where copied, else minus the live number."""
    root, d = (int(v) for v in sql_one(conn, _CLONE_SOURCE, (dir_ino,)))
    sids = _chain_from(conn, sid)
    out = []
    todo = [(dir_ino, d)]
    while todo:
        parent, folder = todo.pop()
        for name, child in names_at(conn, sids, folder):
            row = sql_one(
                conn,
                "SELECT clone_ino FROM clone_inodes WHERE clone_root = ? AND source_ino = ?",
                (root, child),
            )
            number = -child if row is None else int(row[0])
            source = first_copy(conn, sids, child) if row is None else number
            kind_row = sql_one(conn, "SELECT type FROM inodes WHERE ino = ?", (source or child,))
            kind = int(kind_row[0]) if kind_row is not None else 0
            out.append((parent, name, number, kind))
            if kind == DIR and number < 0:  # not copied: its names are still to come
                todo.append((number, child))
    return out
