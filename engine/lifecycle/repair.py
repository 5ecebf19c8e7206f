"""Stripe-level helpers shared by scrub, rebuild, drain and cleaning.

- ``load_stripes``: stripes and their fragments from the catalog.
- ``Reconstructor``: good fragments of a stripe (checksum-verified) and the bytes of
  missing or bad ones, rebuilt from any k good fragments (pyeclib ``reconstruct``
  gives back the identical fragment, header included, so its crc32c matches the
  catalog's) or copied from a good replica.
- ``relocate``: write fragment bytes to new places and repoint the fragments in one
  durable catalog transaction, moving their live share between zones.
- ``complete``: write the fragments a stripe was born without (too few drives or hosts at its
  write) and record them in one durable catalog transaction.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import crc32c
from sqlalchemy import select

from engine.base import errors
from engine.base.ordered_lock import lock
from engine.catalog.models import Fragment, Stripe
from engine.datapath.accounting import chunks
from engine.lifecycle.media import Media, add_fragments, move_fragments

FRAGMENTS = Fragment.__table__
STRIPES = Stripe.__table__
READ_THREADS = 12
_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = lock("lifecycle.stripe_pool")


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="shingle-lifecycle-read")
        return _POOL


@dataclass(frozen=True)
class FragmentRow:
    id: int
    stripe_id: int
    idx: int
    drive_id: int
    zone_id: int
    zone_offset: int
    length: int
    checksum: int


@dataclass
class StripeRow:
    id: int
    band_class: str
    layout: str
    k: int
    m: int
    backend: str | None
    data_length: int
    fragment_length: int
    live_bytes: int
    fragments: dict[int, FragmentRow] = field(default_factory=dict)

    @property
    def width(self) -> int:
        return self.k + self.m

    def drives(self) -> set[int]:
        return {f.drive_id for f in self.fragments.values()}

    def absent(self) -> list[int]:
        """Indexes the stripe has no fragment of: it was written on fewer drives than its width
        (drives or hosts away at its write), or lost them to a write that failed."""
        return [i for i in range(self.width) if i not in self.fragments]


def fragment_row(row) -> FragmentRow:
    return FragmentRow(
        row.id,
        row.stripe_id,
        row.idx,
        row.drive_id,
        row.zone_id,
        row.zone_offset,
        row.length,
        row.checksum,
    )


def load_stripes(conn, stripe_ids) -> dict[int, StripeRow]:
    found: dict[int, StripeRow] = {}
    ids = sorted(set(stripe_ids))
    for part in chunks(ids):
        for r in conn.execute(select(STRIPES).where(STRIPES.c.id.in_(part))):
            found[r.id] = StripeRow(
                r.id,
                r.band_class,
                r.layout,
                r.k,
                r.m,
                r.backend,
                r.data_length,
                r.fragment_length,
                r.live_bytes,
            )
        for r in conn.execute(select(FRAGMENTS).where(FRAGMENTS.c.stripe_id.in_(part))):
            if r.stripe_id in found:
                found[r.stripe_id].fragments[r.idx] = fragment_row(r)
    return found


class Reconstructor:
    def __init__(self, media: Media):
        self.media = media
        self._drivers: dict = {}
        self.bytes_read = 0

    def _driver(self, stripe: StripeRow):
        key = (stripe.k, stripe.m, stripe.backend)
        if key not in self._drivers:
            from pyeclib.ec_iface import ECDriver

            self._drivers[key] = ECDriver(k=stripe.k, m=stripe.m, ec_type=stripe.backend)
        return self._drivers[key]

    def fetch(self, fragment: FragmentRow) -> bytes | None:
        """The fragment's bytes if its drive is readable and its checksum matches, else None."""
        if not self.media.readable(fragment.drive_id):
            return None
        try:
            data = self.media.read(
                fragment.drive_id, fragment.zone_id, fragment.zone_offset, fragment.length
            )
        except (OSError, errors.FsError):
            return None
        self.bytes_read += len(data)
        return data if crc32c.crc32c(data) == fragment.checksum else None

    def rebuild(
        self, stripe: StripeRow, wanted: list[int], good: dict[int, bytes] | None = None
    ) -> dict[int, bytes]:
        """Bytes of fragments ``wanted`` of ``stripe`` from its other good fragments."""
        good = {i: d for i, d in (good or {}).items() if i not in wanted}
        need = 1 if stripe.layout == "replica" else stripe.k
        candidates = [i for i in sorted(stripe.fragments) if i not in wanted and i not in good]
        while len(good) < need and candidates:
            # fetch what is still missing in parallel (one read per drive), more only if some fail
            batch, candidates = candidates[: need - len(good)], candidates[need - len(good) :]
            for idx, data in zip(
                batch, _pool().map(self.fetch, [stripe.fragments[i] for i in batch]), strict=True
            ):
                if data is not None:
                    good[idx] = data
        if len(good) < need:
            raise errors.IOFailure(
                f"stripe {stripe.id} cannot be rebuilt: {len(good)} good fragments of the "
                f"{need} needed (fragments {sorted(stripe.fragments)} of {stripe.width})"
            )
        if stripe.layout == "replica":
            copy = next(iter(good.values()))
            out = {i: copy for i in wanted}
        else:
            try:
                made = self._driver(stripe).reconstruct(list(good.values())[:need], list(wanted))
            except Exception as exc:  # pyeclib raises its own hierarchy
                raise errors.IOFailure(
                    f"stripe {stripe.id}: pyeclib reconstruct failed: {exc}"
                ) from exc
            out = dict(zip(wanted, made, strict=True))
        for idx, data in out.items():
            expected = stripe.fragments[idx].checksum if idx in stripe.fragments else None
            if expected is not None and crc32c.crc32c(data) != expected:
                raise errors.IOFailure(
                    f"stripe {stripe.id} fragment {idx}: rebuilt bytes do not match the "
                    "recorded checksum"
                )
        return out


def relocate(
    media: Media,
    catalog,
    band_class: str,
    moves: list[tuple[FragmentRow, bytes, int]],
    *,
    purpose: str,
    use_reserve: bool = False,
    also: Callable | None = None,
) -> int:
    """Write each (fragment, bytes, target drive) and repoint the fragments in one durable
    transaction (``also(conn, moved)`` runs in it too). Returns how many were repointed;
    a fragment that changed meanwhile is left alone and its new copy is garbage."""
    if not moves:
        return 0
    placements = media.append(
        band_class,
        [(drive_id, data) for _f, data, drive_id in moves],
        purpose=purpose,
        use_reserve=use_reserve,
    )

    def work(conn):
        media.record(conn, placements)
        done = set(
            move_fragments(
                conn,
                [
                    (f.id, f.zone_id, f.zone_offset, p)
                    for (f, _data, _drive), p in zip(moves, placements, strict=True)
                ],
            )
        )
        moved = [
            (f, p) for (f, _data, _drive), p in zip(moves, placements, strict=True) if f.id in done
        ]
        if also is not None:
            also(conn, moved)
        return moved

    try:
        moved = catalog.run(work, durable=True)
    except BaseException:
        media.settle(placements, committed=False)
        raise
    media.settle(placements, committed=True)
    media.dp.invalidate_stripes({f.stripe_id for f, _d, _t in moves})
    return len(moved)


def complete(
    media: Media,
    catalog,
    band_class: str,
    adds: list[tuple[StripeRow, int, bytes, int]],
    *,
    purpose: str,
) -> int:
    """Write each (stripe, absent index, bytes, target drive) and record it as that stripe's
    fragment in one durable transaction. Returns how many were recorded; a stripe gone
    meanwhile, or an index filled meanwhile, is left alone and its new copy is garbage."""
    if not adds:
        return 0
    placements = media.append(
        band_class, [(drive_id, data) for _s, _i, data, drive_id in adds], purpose=purpose
    )

    def work(conn):
        media.record(conn, placements)
        return add_fragments(
            conn,
            [(s.id, idx, p) for (s, idx, _data, _drive), p in zip(adds, placements, strict=True)],
        )

    try:
        added = catalog.run(work, durable=True)
    except BaseException:
        media.settle(placements, committed=False)
        raise
    media.settle(placements, committed=True)
    media.dp.invalidate_stripes({s.id for s, _i, _d, _t in adds})
    return len(added)
