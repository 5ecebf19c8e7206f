"""Redundancy policies of the band classes: erasure coding (pyeclib) or replication.

A ``Policy`` is built and validated when the configuration loads
(``policy_from_dict``), as OpenStack Swift does with its storage policies:
the backend must be present in this pyeclib, k and m in range, the fragment
size sane. A bad value raises ``ConfigError(key, value, expected)`` naming
``band_classes.<class>.<option>``.

Both layouts share one model so the data path has a single code path:

- ``ec``: pyeclib fragments are ``header + payload``; the code is systematic,
  so data fragment i's payload is bytes ``[i*p, (i+1)*p)`` of the stripe data
  (p = payload size). That is checked at load, and it is what lets a healthy
  read fetch only the data fragments covering a range.
- ``replicate``: a stripe is ``copies`` identical fragments with no header
  (k=1, m=copies-1); any good copy serves a read.
"""

from __future__ import annotations

import ctypes
import glob
import os
from dataclasses import dataclass, field
from typing import Literal

from engine.base.errors import ConfigError
from engine.base.ordered_lock import lock
from engine.coding.compression import DEFAULT_LEVEL, check_level

MiB = 1 << 20
# Fragment sizes are bounded so a fragment always fits a zone and a stripe fits memory.
MIN_FRAGMENT_SIZE = 4096
MAX_FRAGMENT_SIZE = 64 * MiB
MAX_K = 32
MAX_M = 8
MAX_COPIES = 8
FRAGMENT_HEADER = 80  # liberasurecode's fragment_header_t; the reader locates payloads with it
ALIGNMENT_SLACK = 512  # most payload padding any backend adds (reservations count it)
REDUNDANCY = ("ec", "replicate")  # what a band class may be configured with
# redundancy and layout of stripes whose bytes the catalog holds (small durable writes)
INLINE = "inline"
COMPRESSION = (None, "zstd")  # engine/coding/compression.py

DEFAULTS: dict[str, dict] = {
    "hot": {"redundancy": "replicate", "copies": 3},
    "warm": {"redundancy": "ec", "k": 8, "m": 2, "backend": "isa_l_rs_vand", "fragment_size": MiB},
    "cold": {
        "redundancy": "ec",
        "k": 8,
        "m": 2,
        "backend": "isa_l_rs_vand",
        "fragment_size": MiB,
        "compression": "zstd",
    },
}
DEFAULT_CLASS = "warm"
HOT_CLASS = "hot"


def inline_policy(band_class: str, max_bytes: int) -> Policy:
    """The policy of inline stripes of ``band_class``: one "fragment", the
    payload, kept in the catalog."""
    return Policy(
        name=band_class,
        redundancy=INLINE,
        k=1,
        m=0,
        backend=None,
        fragment_size=max_bytes,
        copies=1,
        compression=None,
    )


class DecodeError(Exception):
    """Too few good fragments to rebuild a stripe's data."""


class Encoded:
    """The fragments of one stripe. ``release`` frees memory the C library lent
    (call it once written)."""

    __slots__ = ("fragments", "_free")

    def __init__(self, fragments, free=None):
        self.fragments = fragments
        self._free = free

    def release(self) -> None:
        free, self._free = self._free, None
        self.fragments = []
        if free is not None:
            free()

    def __del__(self):
        self.release()


def fragment_length(fragment) -> int:
    """Bytes of a fragment: a buffer, or (header, payload) from the slice encoder."""
    if isinstance(fragment, tuple):
        return len(fragment[0]) + len(fragment[1])
    return len(fragment)


def fragment_bytes(fragment):
    """A fragment as one buffer (a copy only for a (header, payload) pair)."""
    if isinstance(fragment, tuple):
        return b"".join(fragment)
    return fragment


class _EcArgs(ctypes.Structure):
    # struct ec_args of liberasurecode's erasurecode.h
    _fields_ = [
        ("k", ctypes.c_int),
        ("m", ctypes.c_int),
        ("w", ctypes.c_int),
        ("hd", ctypes.c_int),
        ("priv_args1", ctypes.c_uint64 * 4),
        ("priv_args2", ctypes.c_void_p),
        ("ct", ctypes.c_int),
    ]


CHKSUM_NONE = 1
# None until looked for; False when the pyeclib wheel bundles no liberasurecode
_lib: ctypes.CDLL | Literal[False] | None = None
_lib_holding_gil: ctypes.PyDLL | None = None  # the same library, for calls that keep the GIL
_lib_lock = lock("erasure.library")


def _pyeclib_libs() -> str:
    """The folder of the C libraries the pyeclib wheel bundles."""
    import pyeclib

    return os.path.join(os.path.dirname(os.path.dirname(pyeclib.__file__)), "pyeclib.libs")


def _liberasurecode() -> ctypes.CDLL | None:
    """liberasurecode from the pyeclib wheel, called through ctypes, which releases the GIL
    during the call (pyeclib's own encode holds it, so encoding could not overlap anything)."""
    global _lib, _lib_holding_gil
    with _lib_lock:
        if _lib is None:
            found = sorted(glob.glob(os.path.join(_pyeclib_libs(), "liberasurecode-*.so*")))
            if not found:
                _lib = False
                return None
            lib = ctypes.CDLL(found[0])
            lib.liberasurecode_instance_create.argtypes = [ctypes.c_int, ctypes.POINTER(_EcArgs)]
            lib.liberasurecode_instance_create.restype = ctypes.c_int
            pp = ctypes.POINTER(ctypes.POINTER(ctypes.c_char))
            lib.liberasurecode_encode.argtypes = [
                ctypes.c_int,
                ctypes.c_void_p,
                ctypes.c_uint64,
                ctypes.POINTER(pp),
                ctypes.POINTER(pp),
                ctypes.POINTER(ctypes.c_uint64),
            ]
            lib.liberasurecode_encode.restype = ctypes.c_int
            # the cleanup only frees the fragments' buffers: called with the GIL held (PyDLL),
            # the drive thread that completes a stripe does not let go of the GIL and then wait
            # for it again before it wakes the stripe's flush
            held = ctypes.PyDLL(found[0])
            held.liberasurecode_encode_cleanup.argtypes = [ctypes.c_int, pp, pp]
            held.liberasurecode_encode_cleanup.restype = ctypes.c_int
            _lib_holding_gil = held
            lib.liberasurecode_decode.argtypes = [
                ctypes.c_int,
                ctypes.POINTER(ctypes.c_void_p),
                ctypes.c_int,
                ctypes.c_uint64,
                ctypes.c_int,
                ctypes.POINTER(ctypes.POINTER(ctypes.c_char)),
                ctypes.POINTER(ctypes.c_uint64),
            ]
            lib.liberasurecode_decode.restype = ctypes.c_int
            lib.liberasurecode_decode_cleanup.argtypes = [
                ctypes.c_int,
                ctypes.POINTER(ctypes.c_char),
            ]
            lib.liberasurecode_decode_cleanup.restype = ctypes.c_int
            _lib = lib
        return _lib or None


def _address(buffer) -> tuple[int, object]:
    """The address of a bytes-like object's memory and what keeps the address valid (for a
    bytearray a ctypes view, which pins it: drop it right after the call)."""
    if isinstance(buffer, bytes):
        # not ctypes.cast: its result and source refer to each other, so the bytes (or a
        # bytearray's export) would live until the garbage collector runs
        pointer = ctypes.c_char_p(buffer)
        return ctypes.c_void_p.from_buffer(pointer).value or 0, pointer
    view = (ctypes.c_char * len(buffer)).from_buffer(buffer)
    return ctypes.addressof(view), view


class _NativeEncoder:
    """Encode with liberasurecode directly; fragments are views of its buffers until released."""

    def __init__(self, backend_id: int, k: int, m: int):
        lib = _liberasurecode()
        if lib is None:
            raise OSError("liberasurecode library not found next to pyeclib")
        self.lib = lib
        assert _lib_holding_gil is not None  # loaded with it
        self.holding_gil = _lib_holding_gil
        args = _EcArgs(k=k, m=m, w=0, hd=m, ct=CHKSUM_NONE)
        self.desc = self.lib.liberasurecode_instance_create(backend_id, ctypes.byref(args))
        if self.desc <= 0:
            raise OSError(
                f"liberasurecode_instance_create({backend_id}, k={k}, m={m}) returned {self.desc}"
            )
        self.k, self.m = k, m

    def encode(self, data) -> Encoded:
        length = len(data)
        source, keep = _address(data)
        pp = ctypes.POINTER(ctypes.POINTER(ctypes.c_char))
        data_p, parity_p, flen = pp(), pp(), ctypes.c_uint64()
        rc = self.lib.liberasurecode_encode(
            self.desc,
            ctypes.c_void_p(source),
            length,
            ctypes.byref(data_p),
            ctypes.byref(parity_p),
            ctypes.byref(flen),
        )
        del keep
        if rc != 0:
            raise OSError(f"liberasurecode_encode returned {rc}")
        size = flen.value
        fragments = [
            memoryview((ctypes.c_char * size).from_address(ctypes.addressof(p.contents))).cast("B")
            for p in [data_p[i] for i in range(self.k)] + [parity_p[i] for i in range(self.m)]
        ]
        lib, desc = self.holding_gil, self.desc

        def free():
            try:
                for view in fragments:
                    view.release()
            except BufferError:
                # someone still holds a view: leaking the buffers beats freeing them under it
                return
            lib.liberasurecode_encode_cleanup(desc, data_p, parity_p)

        return Encoded(fragments, free)

    def decode(self, fragments: list) -> bytes:
        """The data from any k fragments (bytes or bytearrays of equal length, headers included)."""
        keep = [
            f if isinstance(f, bytes) else (ctypes.c_char * len(f)).from_buffer(f)
            for f in fragments
        ]
        pointers = (ctypes.c_void_p * len(keep))(
            *[
                ctypes.cast(ctypes.c_char_p(f), ctypes.c_void_p).value
                if isinstance(f, bytes)
                else ctypes.addressof(f)
                for f in keep
            ]
        )
        out, out_len = ctypes.POINTER(ctypes.c_char)(), ctypes.c_uint64()
        rc = self.lib.liberasurecode_decode(
            self.desc,
            pointers,
            len(keep),
            len(fragments[0]),
            0,
            ctypes.byref(out),
            ctypes.byref(out_len),
        )
        if rc != 0:
            raise DecodeError(f"liberasurecode_decode returned {rc}")
        try:
            return ctypes.string_at(out, out_len.value)
        finally:
            self.lib.liberasurecode_decode_cleanup(self.desc, out)


# ISA-L's matrix generator behind each liberasurecode backend of it (isa_l_common.c)
_ISAL_MATRIX = {"isa_l_rs_vand": "gf_gen_rs_matrix", "isa_l_rs_cauchy": "gf_gen_cauchy1_matrix"}
_HEADER_CACHE = 64  # data lengths whose fragment headers are kept (a flush cuts few lengths)


class _SliceEncoder:
    """Encode without copying the stripe: each data fragment is (header, a slice of the stripe's
    buffer), each parity fragment (header, a slice of one buffer ISA-L computes the parity into
    straight from those slices). liberasurecode copies the stripe into zeroed fragment buffers
    first; that copy and zeroing were a tenth of a checkpoint writer's CPU per MiB
    (docs/performance.md, "the write-CPU sessions"). The headers depend only on the stripe's
    length (no checksums: CHKSUM_NONE), so the first stripe of each length is encoded by
    liberasurecode and its headers kept; ``_attach_slices`` checks the result byte for byte
    against liberasurecode's before a policy uses it. The drive writers write the two parts
    with one pwritev (engine/native/drivewriters.pyx ``append_parts``)."""

    def __init__(self, native: _NativeEncoder, backend: str):
        self.native = native
        self.k, self.m = k, m = native.k, native.m
        found = sorted(glob.glob(os.path.join(_pyeclib_libs(), "libisal*.so*")))
        if backend not in _ISAL_MATRIX or not found:
            raise OSError(f"no ISA-L library for {backend} in the pyeclib wheel")
        isal = ctypes.CDLL(found[0])
        matrix = (ctypes.c_ubyte * ((k + m) * k))()
        getattr(isal, _ISAL_MATRIX[backend])(matrix, k + m, k)
        self.tables = (ctypes.c_ubyte * (k * m * 32))()
        isal.ec_init_tables(k, m, ctypes.byref(matrix, k * k), self.tables)
        isal.ec_encode_data.argtypes = [
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        isal.ec_encode_data.restype = None
        self.encode_data = isal.ec_encode_data
        self.headers: dict[int, tuple[list[bytes], int]] = {}  # length -> (headers, payload)
        self.zeros: dict[int, bytes] = {}
        self.lock = lock("erasure.headers")

    def encode(self, data) -> Encoded:
        length = len(data)
        known = self.headers.get(length)
        if known is None:
            encoded = self.native.encode(data)
            first = encoded.fragments[0]
            headers = [bytes(f[:FRAGMENT_HEADER]) for f in encoded.fragments]
            with self.lock:
                if len(self.headers) >= _HEADER_CACHE:
                    self.headers.pop(next(iter(self.headers)))
                self.headers[length] = (headers, len(first) - FRAGMENT_HEADER)
            return encoded
        headers, size = known
        k, m = self.k, self.m
        whole = min(length // size, k)  # data fragments lying wholly inside the stripe
        view = memoryview(data).cast("B")
        payloads: list = [view[i * size : (i + 1) * size] for i in range(whole)]
        if whole < k:
            tail = bytearray(size)  # the last bytes, zero-padded as liberasurecode pads them
            tail[: length - whole * size] = view[whole * size :]
            payloads.append(tail)
            if whole + 1 < k:
                zeros = self.zeros.get(size)
                if zeros is None:
                    zeros = self.zeros[size] = bytes(size)
                payloads.extend([zeros] * (k - whole - 1))
        parity = bytearray(m * size)
        base, keep_data = _address(data)
        sources = [base + i * size for i in range(whole)]
        keep = [keep_data]
        for payload in payloads[whole:]:
            address, pin = _address(payload)
            sources.append(address)
            keep.append(pin)
        out, pin = _address(parity)
        keep.append(pin)
        self.encode_data(
            size,
            k,
            m,
            self.tables,
            (ctypes.c_void_p * k)(*sources),
            (ctypes.c_void_p * m)(*[out + j * size for j in range(m)]),
        )
        del keep, pin, keep_data
        out_view = memoryview(parity)
        payloads.extend(out_view[j * size : (j + 1) * size] for j in range(m))
        views = [p for p in payloads if isinstance(p, memoryview)] + [view, out_view]

        def free():
            for v in views:
                v.release()

        return Encoded(list(zip(headers, payloads, strict=True)), free)


class Decoder:
    """Decodes stripes of one (k, m, backend): liberasurecode directly when
    it agrees with pyeclib."""

    def __init__(self, k: int, m: int, backend: str):
        from pyeclib.ec_iface import ECDriver, PyECLib_EC_Types

        self.k, self.m, self.backend = k, m, backend
        self.driver = ECDriver(k=k, m=m, ec_type=backend)
        self.native = None
        try:
            native = _NativeEncoder(PyECLib_EC_Types[backend].value, k, m)
            sample = os.urandom(k * 1000 + 3)
            fragments = self.driver.encode(sample)
            if native.decode(fragments[m:]) == sample and native.decode(fragments[:k]) == sample:
                self.native = native
        except (OSError, KeyError, DecodeError):
            self.native = None

    def decode(self, fragments: list) -> bytes:
        if self.native is not None:
            return self.native.decode(fragments)
        return self.driver.decode([bytes(f) for f in fragments])


_decoders: dict = {}


def decoder_for(k: int, m: int, backend: str) -> Decoder:
    key = (k, m, backend)
    decoder = _decoders.get(key)
    if decoder is None:
        decoder = _decoders[key] = Decoder(k, m, backend)
    return decoder


@dataclass(eq=False)
class Policy:
    name: str
    redundancy: str
    k: int
    m: int
    backend: str | None
    fragment_size: int  # payload bytes per fragment of a full stripe
    copies: int
    compression: str | None
    compression_level: int = DEFAULT_LEVEL  # zstd level of stripes tiering writes into the class
    header_size: int = 0  # bytes pyeclib puts before each fragment's payload
    _driver: object = field(default=None, repr=False)
    _native: _NativeEncoder | _SliceEncoder | None = field(default=None, repr=False)
    _min_parity: int = 1

    def set_min_parity(self, count: int) -> None:
        """The parity fragments the codec needs at the least (part of the write quorum)."""
        self._min_parity = count

    def use_native(self, native) -> None:
        """Encode through ``native`` (liberasurecode by ctypes, checked against pyeclib)."""
        self._native = native

    # -- geometry -------------------------------------------------------------
    @property
    def width(self) -> int:
        """Fragments per stripe, each on a different drive."""
        return self.k + self.m

    @property
    def stripe_size(self) -> int:
        """User bytes in a full stripe."""
        return self.k * self.fragment_size

    @property
    def layout(self) -> str:
        if self.redundancy in ("ec", INLINE):
            return self.redundancy
        return "replica"

    def payload_size(self, data_length: int) -> int:
        """Payload bytes per fragment for ``data_length`` bytes, at most (backends may pad less)."""
        return -(-data_length // self.k) + ALIGNMENT_SLACK if self.k > 1 else data_length

    def fragment_length(self, data_length: int) -> int:
        return self.header_size + self.payload_size(data_length)

    @property
    def max_fragment_length(self) -> int:
        return self.fragment_length(self.stripe_size)

    @property
    def write_quorum(self) -> int:
        """Fragments a stripe needs on distinct drives to be written at all (Swift: data fragments
        plus the parity the codec needs); the rest are added by rebuild."""
        if self.redundancy == "replicate":
            return min(2, self.copies)
        return self.k + self._min_parity

    @property
    def efficiency(self) -> float:
        """User bytes per raw byte (k/(k+m), or 1/copies)."""
        return self.k / self.width

    # -- coding ---------------------------------------------------------------
    @property
    def driver(self):
        if self._driver is None and self.redundancy == "ec":
            from pyeclib.ec_iface import ECDriver

            self._driver = ECDriver(k=self.k, m=self.m, ec_type=self.backend)
        return self._driver

    def encode(self, data: bytes) -> list[bytes]:
        """The stripe's fragments, data fragments first."""
        if self.redundancy != "ec":
            return [data] * self.copies
        return self.driver.encode(data)

    def encode_stripe(self, data) -> Encoded:
        """Like ``encode``, without holding the GIL where the library allows
        it (bytes or bytearray)."""
        if self.redundancy != "ec":
            return Encoded([data] * self.copies)
        if self._native is not None:
            return self._native.encode(data)
        return Encoded(self.driver.encode(bytes(data)))

    def decode(self, fragments: dict[int, bytes], data_length: int) -> bytes:
        """The stripe's data from any k good fragments (index -> bytes on disk)."""
        if len(fragments) < self.k:
            raise DecodeError(f"stripe needs {self.k} good fragments, {len(fragments)} available")
        if self.redundancy == "replicate":
            return next(iter(fragments.values()))[:data_length]
        try:
            return self.driver.decode(list(fragments.values()))[:data_length]
        except Exception as exc:  # pyeclib raises its own hierarchy
            raise DecodeError(f"pyeclib {self.backend} could not decode: {exc}") from exc

    def as_row(self) -> dict:
        """Values of the band_classes catalog row."""
        return {
            "name": self.name,
            "redundancy": self.redundancy,
            "copies": self.copies,
            "ec_k": self.k if self.redundancy == "ec" else 1,
            "ec_m": self.m if self.redundancy == "ec" else self.copies - 1,
            "ec_backend": self.backend or "",
            "fragment_size": self.fragment_size,
            "compression": self.compression,
        }


def _int(key: str, value, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(key, value, f"an integer from {low} to {high}")
    return value


def available_backends() -> list[str]:
    from pyeclib.ec_iface import VALID_EC_TYPES

    return list(VALID_EC_TYPES)


def policy_from_dict(name: str, options: dict) -> Policy:
    """Build and validate the policy of band class ``name``."""
    prefix = f"band_classes.{name}"
    if not isinstance(options, dict):
        raise ConfigError(prefix, options, "a table of options")
    known = {
        "redundancy",
        "k",
        "m",
        "backend",
        "fragment_size",
        "copies",
        "compression",
        "compression_level",
    }
    for key in options:
        if key not in known:
            raise ConfigError(
                f"{prefix}.{key}", options[key], f"one of the options {sorted(known)}"
            )
    base = DEFAULTS.get(name, DEFAULTS[DEFAULT_CLASS])
    redundancy = options.get("redundancy", base["redundancy"])
    if redundancy not in REDUNDANCY:
        raise ConfigError(f"{prefix}.redundancy", redundancy, f"one of {list(REDUNDANCY)}")
    compression = options.get(
        "compression", base.get("compression") if redundancy == base["redundancy"] else None
    )
    if compression not in COMPRESSION:
        raise ConfigError(f"{prefix}.compression", compression, "none or 'zstd'")
    level = check_level(
        f"{prefix}.compression_level", options.get("compression_level", DEFAULT_LEVEL)
    )
    fallback = DEFAULTS["warm"] if redundancy == "ec" else DEFAULTS["hot"]
    if redundancy == "replicate":
        copies = _int(f"{prefix}.copies", options.get("copies", fallback["copies"]), 2, MAX_COPIES)
        size = _int(
            f"{prefix}.fragment_size",
            options.get("fragment_size", MiB),
            MIN_FRAGMENT_SIZE,
            MAX_FRAGMENT_SIZE,
        )
        return Policy(name, "replicate", 1, copies - 1, None, size, copies, compression, level)
    k = _int(f"{prefix}.k", options.get("k", fallback["k"]), 2, MAX_K)
    m = _int(f"{prefix}.m", options.get("m", fallback["m"]), 1, MAX_M)
    backend = options.get("backend", fallback["backend"])
    backends = available_backends()
    if backend not in backends:
        raise ConfigError(
            f"{prefix}.backend", backend, f"an erasure-code backend present in pyeclib: {backends}"
        )
    size = _int(
        f"{prefix}.fragment_size",
        options.get("fragment_size", fallback["fragment_size"]),
        MIN_FRAGMENT_SIZE,
        MAX_FRAGMENT_SIZE,
    )
    if size % 4096:
        raise ConfigError(f"{prefix}.fragment_size", size, "a multiple of 4096 bytes")
    policy = Policy(name, "ec", k, m, backend, size, 1, compression, level)
    try:
        driver = policy.driver
    except Exception as exc:
        raise ConfigError(
            f"{prefix}.backend", backend, f"a backend that accepts k={k}, m={m} ({exc})"
        ) from None
    # The write quorum comes from the codec: it must tolerate the m losses we promise.
    if driver.min_parity_fragments_needed() > m:
        raise ConfigError(
            f"{prefix}.m", m, f"at least {driver.min_parity_fragments_needed()} for {backend}"
        )
    policy.set_min_parity(driver.min_parity_fragments_needed())
    _check_systematic(policy, f"{prefix}.backend")
    return policy


def _check_systematic(policy: Policy, key: str) -> None:
    """Prove the fragment header size and that data fragments hold plain bytes."""
    even = bytes(policy.k * 4096)  # no alignment padding at this length: the rest is header
    header = len(policy.driver.encode(even)[0]) - 4096
    if header != FRAGMENT_HEADER:
        raise ConfigError(
            key,
            policy.backend,
            f"a backend with {FRAGMENT_HEADER}-byte fragment headers, got {header}",
        )
    sample = bytes((i * 7 + 3) & 0xFF for i in range(policy.k * 512 + 5))
    fragments = policy.driver.encode(sample)
    payload = len(fragments[0]) - header
    if payload * policy.k < len(sample) or any(len(f) != len(fragments[0]) for f in fragments):
        raise ConfigError(key, policy.backend, "a backend whose fragments are all the same length")
    for i in range(policy.k):
        chunk = sample[i * payload : (i + 1) * payload]
        if fragments[i][header : header + len(chunk)] != chunk:
            raise ConfigError(
                key, policy.backend, "a systematic code (data fragments hold the plain data)"
            )
    policy.header_size = header
    _attach_native(policy)


def _attach_native(policy: Policy) -> None:
    """Use liberasurecode directly when it produces exactly pyeclib's fragments."""
    from pyeclib.ec_iface import PyECLib_EC_Types

    if policy.backend is None:  # replicated and inline policies have no codec
        return
    try:
        native = _NativeEncoder(PyECLib_EC_Types[policy.backend].value, policy.k, policy.m)
        for length in (policy.k * 4096, policy.k * 512 + 5, 1):
            sample = os.urandom(length)
            encoded = native.encode(bytearray(sample))
            same = [bytes(f) for f in encoded.fragments] == policy.driver.encode(sample)
            encoded.release()
            if not same:
                return
    except (OSError, KeyError, AttributeError, ValueError):
        return
    policy.use_native(native)
    _attach_slices(policy, native)


_slice_encoders: dict[tuple, _SliceEncoder | None] = {}  # checked once per code and process


def _attach_slices(policy: Policy, native: _NativeEncoder) -> None:
    """Encode on slices of the stripe (``_SliceEncoder``) when, for stripes of several lengths,
    each encoded a second time with other bytes, its fragments equal liberasurecode's."""
    key = (policy.backend, policy.k, policy.m)
    if key not in _slice_encoders:
        _slice_encoders[key] = _checked_slices(policy, native)
    slices = _slice_encoders[key]
    if slices is not None:
        policy.use_native(slices)


def _checked_slices(policy: Policy, native: _NativeEncoder) -> _SliceEncoder | None:
    try:
        slices = _SliceEncoder(native, policy.backend or "")
        # small lengths: the payload size and padding come from liberasurecode's own fragments
        for length in (policy.k * 4096, policy.k * 12288 + 17, policy.k * 512 + 5, 4099, 1):
            for _ in range(2):  # the first one learns the headers, the second uses them
                sample = bytearray(os.urandom(length))
                theirs = native.encode(sample)
                ours = slices.encode(bytes(sample) if length % 2 else sample)
                same = [bytes(f) for f in theirs.fragments] == [
                    bytes(fragment_bytes(f)) for f in ours.fragments
                ]
                theirs.release()
                ours.release()
                if not same:
                    return None
    except (OSError, AttributeError, ValueError):
        return None
    return slices


def load_policies(config: dict | None = None) -> dict[str, Policy]:
    """hot, warm and cold policies: the defaults overridden by ``config``."""
    config = dict(config or {})
    names = list(DEFAULTS) + [n for n in config if n not in DEFAULTS]
    return {name: policy_from_dict(name, config.get(name, {})) for name in names}
