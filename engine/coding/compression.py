"""Stripe compression: zstd (the ``zstandard`` package) on a stripe's data before it is encoded.

A band class with ``compression = "zstd"`` (cold, by default) has each stripe that tiering writes
into it compressed as one zstd frame before erasure coding; the k+m fragments then hold the
frame, and the stripe's catalog row records the codec (``stripes.compression``) and the frame's
length (``stripes.stored_length``), while ``data_length`` stays the user bytes it holds (extents,
live counts and their shares of zones are all in user bytes). Data that compresses poorly
(token shards, already-compressed files) is stored raw: the frame is kept only when it saves at
least ``MIN_SAVING`` of the stripe, since each compressed stripe costs a whole-stripe
decompression on every read of it. Frames carry zstd's own content size and checksum, so a
decompression that went wrong is an error, never wrong bytes."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import zstandard

from engine.base import errors
from engine.base.errors import ConfigError

ZSTD = "zstd"
CODECS = (ZSTD,)
DEFAULT_LEVEL = 3
MIN_LEVEL, MAX_LEVEL = 1, 19  # 20-22 ("ultra") need a window of up to 128 MiB per stream
# keep the frame only if it is at most (1 - MIN_SAVING) of the raw stripe
MIN_SAVING = 1 / 16

_local = threading.local()  # zstd contexts are not safe to share between threads


def _compressor(level: int) -> zstandard.ZstdCompressor:
    cache = getattr(_local, "compressors", None)
    if cache is None:
        cache = _local.compressors = {}
    found = cache.get(level)
    if found is None:
        found = cache[level] = zstandard.ZstdCompressor(
            level=level, write_checksum=True, write_content_size=True
        )
    return found


def _decompressor() -> zstandard.ZstdDecompressor:
    found = getattr(_local, "decompressor", None)
    if found is None:
        found = _local.decompressor = zstandard.ZstdDecompressor()
    return found


@dataclass(frozen=True)
class Packed:
    """What a stripe stores: ``data`` (a zstd frame, or the raw bytes when ``codec`` is None)."""

    data: bytes
    codec: str | None
    raw_length: int
    cpu_s: float  # thread CPU seconds spent compressing

    @property
    def stored_length(self) -> int | None:
        """The frame's length for the catalog (None for a raw stripe)."""
        return len(self.data) if self.codec is not None else None


def pack(data: bytes | bytearray, codec: str | None, level: int = DEFAULT_LEVEL) -> Packed:
    """The bytes a stripe of ``data`` stores under ``codec`` (raw when it does not pay)."""
    raw = bytes(data)
    if codec is None or not raw:
        return Packed(raw, None, len(raw), 0.0)
    if codec != ZSTD:
        raise errors.InvalidArgument(f"compression {codec!r}: expected one of {CODECS}")
    started = time.thread_time()
    frame = _compressor(level).compress(raw)
    spent = time.thread_time() - started
    if len(frame) > len(raw) * (1 - MIN_SAVING):
        return Packed(raw, None, len(raw), spent)
    return Packed(frame, ZSTD, len(raw), spent)


def unpack(stored, codec: str | None, raw_length: int, *, stripe_id: int | None = None) -> bytes:
    """The user bytes of a stripe from what it stores; IOFailure if they are not what was
    recorded (a frame that does not decompress to exactly ``raw_length`` bytes)."""
    if codec is None:
        return bytes(stored)
    where = f"stripe {stripe_id}" if stripe_id is not None else "stripe"
    if codec != ZSTD:
        raise errors.IOFailure(f"{where}: unknown compression {codec!r}, expected one of {CODECS}")
    try:
        data = _decompressor().decompress(stored, max_output_size=raw_length)
    except zstandard.ZstdError as exc:
        raise errors.IOFailure(f"{where}: zstd frame does not decompress: {exc}") from exc
    if len(data) != raw_length:
        raise errors.IOFailure(
            f"{where}: zstd frame holds {len(data)} bytes, the catalog records {raw_length}"
        )
    return data


def check_level(key: str, value) -> int:
    """A compression level from the config, or ConfigError naming ``key``."""
    if isinstance(value, bool) or not isinstance(value, int) or not MIN_LEVEL <= value <= MAX_LEVEL:
        raise ConfigError(key, value, f"a zstd level from {MIN_LEVEL} to {MAX_LEVEL}")
    return value
