"""The data path: per-file write buffers, stripe encoding, band-aligned placement, reads, recovery.

Write path
    ``write`` copies bytes into the file's buffer (one per file). A full
    stripe (k x fragment size of the file's band class), or a ``flush``,
    hands the buffered bytes to the pipeline: encode (pyeclib, worker
    threads) -> the dispatcher places the k+m fragments, in submission
    order, on k+m different drives with the most free zones, each at the
    write pointer of that drive's open band of the class -> each drive's
    single writer thread appends them -> the committer fsyncs the zones
    touched and records a batch of stripes in ONE catalog transaction
    (stripes, fragments, extents, zone pointers, inode size/mtime/ctime/
    change), with ``durable=True``. ``flush`` returns when its stripes
    committed. Space is reserved at ``write`` time, so a write that cannot
    be placed fails with ENOSPC before anything of it is buffered.
    A flush smaller than one fragment of the default class (a few KiB of a
    small or random write) goes to the hot class instead, unless the inode
    pins its class (``Inode.band_class``); tiering re-encodes it. Up to
    INLINE_WRITE_BYTES (64 KiB) it becomes an *inline* stripe: its bytes are
    a row of ``inline_data`` written in the flush's own catalog transaction,
    so a durable 4 KiB write costs one fsync round (the catalog's) instead
    of two (fragments, then catalog). Inline bytes are on no drive, so no
    drive loss touches them; they share the catalog's durability, as
    metadata does. INLINE_BUDGET_BYTES (256 MiB) bounds them; past it small
    flushes are replicated on three drives (both sizes are the config's
    ``storage.inline_write_bytes`` and ``storage.inline_budget_bytes``).
    Each drive's syncer fsyncs what its writer appended meanwhile (group
    commit); a writer with nothing else queued fsyncs itself. A fragment
    counts as written only once it is durable; fragments sit on the drive's
    write granularity (4 KiB on a zoned disk). A flush encodes, places and
    (when the committer is idle) records its own stripe, sparing the
    hand-offs to the encoder, dispatcher and committer threads; a dispatch
    lock and a commit lock keep placement and commits in submission order.

Catalog layout (engine/catalog/models.py)
    - Stripe: one unit of redundancy. ``layout`` "ec" (k data + m parity
      pyeclib fragments, each ``header + payload``, payload = ceil(data/k))
      or "replica" (k=1, m=copies-1, each fragment the plain data) or
      "inline" (k=1, m=0, no fragments: the bytes and their crc32c are the
      stripe's ``inline_data`` row, deleted with it).
      ``data_length`` user bytes, ``fragment_length`` bytes per fragment on
      disk, ``live_bytes`` user bytes still referenced by extents. A stripe
      tiering compressed (engine/coding/compression.py) has ``compression`` "zstd"
      and ``stored_length`` the frame's length: the fragments encode the frame,
      every other column still counts user bytes.
    - Fragment: (stripe, idx) -> (drive, zone, zone_offset, length, crc32c
      of the bytes on disk). Data fragment i holds stripe bytes
      [i*payload, (i+1)*payload) after its header.
    - Extent: (ino, file_offset, length) -> (stripe, stripe_offset). A file's
      extents never overlap; overwrites, truncates and deletes split or drop
      them and the dropped bytes become garbage.
    - Zone: ``write_pointer`` = committed end on the medium,
      ``write_pointer == live_bytes + garbage_bytes`` (see
      accounting.py for the per-fragment share rule), ``state`` empty/open/
      full, ``band_class`` of an open or full band. A zone with
      ``live_bytes == 0`` is reset when space runs short (invariant 6).

Read path
    Extent maps are cached per file; the data fragments covering a range are
    read by the asking thread, first each without waiting from the page cache,
    the rest after a ``will_read`` hint to each drive (so the drives fetch in
    parallel), and checked against their crc32c; the NFS event loop reads a
    warm file itself (only what is in memory), without a worker; inline
    stripes are read from the catalog; a compressed stripe is read whole,
    decompressed once and its user bytes cached for the next READs; a missing drive
    (failed state, or its folder gone), a read error or a bad checksum makes
    the stripe decode from any k good fragments. Sequential readers get
    read-ahead of whole stripes. Holes read as zeros. A fragment that failed
    its checksum is rebuilt after the decode and appended to an open band of
    the same drive; the catalog then points at the new copy and the bad
    bytes are garbage (invariant 5).

Crash recovery (``recover``, run at start)
    Bytes on a zone beyond its committed write pointer are from a flush that
    never committed: counted as garbage, never referenced, and the next
    append goes after them."""

from engine.datapath.core import DataPath, RecoveryReport

__all__ = ["DataPath", "RecoveryReport"]
