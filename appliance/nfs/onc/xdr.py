"""Declarative XDR (RFC 4506): types are declared once, codecs derive from them.

Every type object has ``pack(packer, value)`` and ``unpack(buf, pos) ->
(value, pos)``. Decoding is bounded: a length or count larger than the
declared maximum or than the bytes left raises ``XdrError`` (the caller turns
it into GARBAGE_ARGS or NFS4ERR_BADXDR), never a large allocation.

Value shapes: integers are ``int``, opaque is ``bytes`` (``memoryview`` for
large payloads on decode, zero-copy), strings are ``str`` (UTF-8,
surrogateescape so any bytes round-trip), arrays are ``list``, optionals are
the value or ``None``, structs are instances of a generated slotted class
(also accepting tuples on encode), unions are ``(discriminant, arm value)``.

Two implementations, one behaviour: this module's Python classes, and the same classes
compiled from appliance/nfs/onc/xdrcodec.pyx (built by setup.py; about 20 % of the server's
GIL-held time on small operations was this codec). The public names below are bound to the
compiled classes when that module is built, unless ``SHINGLE_NATIVE=0`` (every compiled part
off) or ``SHINGLE_NATIVE_XDR=0`` (this codec only) is set; ``IMPLEMENTATION`` says which
("compiled" or "python") and ``PYTHON`` always holds the Python classes. The choice is made
once, at import, in ``_bind_compiled``; the two sets do not mix (a compiled type nests
compiled types and packs into a compiled Packer), which holds as long as types are declared
with the names imported from here. ``XdrError``, ``StructValue`` and ``BIG_CHUNK`` come from
appliance.nfs.onc.xdrcommon and are the same objects for both.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from types import ModuleType, SimpleNamespace
from typing import Any

from appliance.nfs.onc.xdrcommon import BIG_CHUNK, StructValue, XdrError, struct_class

__all__ = [
    "BIG_CHUNK",
    "IMPLEMENTATION",
    "PYTHON",
    "Array",
    "Bool",
    "Enum",
    "FixedOpaque",
    "Hyper",
    "Int",
    "LinkedList",
    "Opaque",
    "Optional",
    "Packer",
    "String",
    "Struct",
    "StructValue",
    "UHyper",
    "UInt",
    "Union",
    "Void",
    "XdrError",
    "XdrType",
]

_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_PAD = (b"", b"\0\0\0", b"\0\0", b"\0")


class Packer:
    """Collects encoded bytes: small items in one bytearray, big payloads as
    separate chunks so a 1 MiB READ reply is never copied into a buffer."""

    __slots__ = ("buf", "chunks", "size")

    def __init__(self):
        self.buf = bytearray()
        self.chunks: list = []
        self.size = 0

    def big(self, data) -> None:
        if self.buf:
            self.size += len(self.buf)
            self.chunks.append(bytes(self.buf))
            self.buf = bytearray()
        self.chunks.append(data)
        self.size += len(data)

    def result(self) -> list:
        """The encoded chunks (bytes-like), in order."""
        if self.buf:
            self.size += len(self.buf)
            self.chunks.append(bytes(self.buf))
            self.buf = bytearray()
        return self.chunks

    def getvalue(self) -> bytes:
        return b"".join(self.result())

    def __len__(self) -> int:
        return self.size + len(self.buf)


# The Python classes use one another through these aliases (_PyPacker, _PY_INT, _PY_BOOL):
# the public names may be rebound to the compiled classes at the end of the module.
_PyPacker = Packer


class XdrType:
    name = "?"

    def pack(self, p: Packer, value) -> None:
        raise NotImplementedError

    def unpack(self, buf, pos: int):
        raise NotImplementedError

    def encode(self, value) -> bytes:
        p = _PyPacker()
        self.pack(p, value)
        return p.getvalue()

    def decode(self, data, *, whole: bool = True):
        """Decode ``data``; with ``whole`` trailing bytes are an error."""
        value, pos = self.unpack(data, 0)
        if whole and pos != len(data):
            raise XdrError(f"{self.name}: {len(data) - pos} trailing bytes after the value")
        return value

    def __repr__(self):
        return f"<xdr {self.name}>"


class _Fixed(XdrType):
    def __init__(self, name: str, codec: struct.Struct, lo: int, hi: int):
        self.name, self.codec, self.lo, self.hi = name, codec, lo, hi
        self.size = codec.size
        self._pack = codec.pack
        self._unpack = codec.unpack_from

    def pack(self, p, value):
        try:
            p.buf += self._pack(value)
        except struct.error as exc:
            raise XdrError(
                f"{self.name}: cannot encode {value!r}: expected {self.lo}..{self.hi}"
            ) from exc

    def unpack(self, buf, pos):
        end = pos + self.size
        if end > len(buf):
            raise XdrError(
                f"{self.name}: needs {self.size} bytes at offset {pos}, {len(buf) - pos} left"
            )
        return self._unpack(buf, pos)[0], end


Int = _Fixed("int", _I32, -(1 << 31), (1 << 31) - 1)
UInt = _Fixed("unsigned int", _U32, 0, (1 << 32) - 1)
Hyper = _Fixed("hyper", _I64, -(1 << 63), (1 << 63) - 1)
UHyper = _Fixed("unsigned hyper", _U64, 0, (1 << 64) - 1)
_PY_INT = Int


class _Bool(XdrType):
    name = "bool"

    def pack(self, p, value):
        p.buf += b"\0\0\0\1" if value else b"\0\0\0\0"

    def unpack(self, buf, pos):
        if pos + 4 > len(buf):
            raise XdrError(f"bool: needs 4 bytes at offset {pos}")
        v = _U32.unpack_from(buf, pos)[0]
        if v > 1:
            raise XdrError(f"bool: value {v} at offset {pos}: expected 0 or 1")
        return v == 1, pos + 4


Bool = _Bool()
_PY_BOOL = Bool


class _Void(XdrType):
    name = "void"

    def pack(self, p, value):
        pass

    def unpack(self, buf, pos):
        return None, pos


Void = _Void()


class Enum(XdrType):
    """A signed 32-bit enum; ``values`` restricts what decodes (None: any)."""

    def __init__(self, name: str, values=None):
        self.name = name
        self.values = frozenset(values) if values is not None else None

    def pack(self, p, value):
        _PY_INT.pack(p, value)

    def unpack(self, buf, pos):
        value, pos = _PY_INT.unpack(buf, pos)
        if self.values is not None and value not in self.values:
            raise XdrError(f"{self.name}: value {value} is not one of {sorted(self.values)}")
        return value, pos


class FixedOpaque(XdrType):
    def __init__(self, size: int, name: str | None = None):
        self.size = size
        self.name = name or f"opaque[{size}]"
        self.padded = size + (-size) % 4

    def pack(self, p, value):
        if len(value) != self.size:
            raise XdrError(f"{self.name}: got {len(value)} bytes, expected {self.size}")
        p.buf += value
        p.buf += _PAD[self.size % 4]

    def unpack(self, buf, pos):
        end = pos + self.size
        if pos + self.padded > len(buf):
            raise XdrError(
                f"{self.name}: needs {self.padded} bytes at offset {pos}, {len(buf) - pos} left"
            )
        return bytes(buf[pos:end]), pos + self.padded


class Opaque(XdrType):
    """Variable-length opaque<max>; decodes big values as memoryviews."""

    def __init__(self, maximum: int | None = None, name: str | None = None):
        self.maximum = maximum
        self.name = name or (f"opaque<{maximum}>" if maximum else "opaque<>")

    def pack(self, p, value):
        n = len(value)
        if self.maximum is not None and n > self.maximum:
            raise XdrError(f"{self.name}: {n} bytes exceed the maximum {self.maximum}")
        p.buf += _U32.pack(n)
        if n >= BIG_CHUNK:
            p.big(value)
        else:
            p.buf += value
        if n % 4:
            p.buf += _PAD[n % 4]

    def unpack(self, buf, pos):
        if pos + 4 > len(buf):
            raise XdrError(f"{self.name}: length needs 4 bytes at offset {pos}")
        n = _U32.unpack_from(buf, pos)[0]
        if self.maximum is not None and n > self.maximum:
            raise XdrError(f"{self.name}: length {n} exceeds the maximum {self.maximum}")
        start = pos + 4
        end = start + n
        if end + (-n) % 4 > len(buf):
            raise XdrError(
                f"{self.name}: length {n} at offset {pos} runs past the end "
                f"({len(buf) - start} left)"
            )
        value: memoryview | bytes
        if n >= BIG_CHUNK:
            value = memoryview(buf)[start:end]
        else:
            value = bytes(buf[start:end])
        return value, end + (-n) % 4


class String(Opaque):
    """string<max>: UTF-8 text (surrogateescape keeps any bytes)."""

    def __init__(self, maximum: int | None = None, name: str | None = None):
        super().__init__(maximum, name or (f"string<{maximum}>" if maximum else "string<>"))

    def pack(self, p, value):
        if isinstance(value, str):
            value = value.encode("utf-8", "surrogateescape")
        super().pack(p, value)

    def unpack(self, buf, pos):
        value, pos = super().unpack(buf, pos)
        return bytes(value).decode("utf-8", "surrogateescape"), pos


class Array(XdrType):
    """T<max>: variable-length array."""

    def __init__(self, of: XdrType, maximum: int | None = None, name: str | None = None):
        self.of, self.maximum = of, maximum
        self.name = name or f"{of.name}<{maximum or ''}>"

    def pack(self, p, value):
        n = len(value)
        if self.maximum is not None and n > self.maximum:
            raise XdrError(f"{self.name}: {n} items exceed the maximum {self.maximum}")
        p.buf += _U32.pack(n)
        pack = self.of.pack
        for item in value:
            pack(p, item)

    def unpack(self, buf, pos):
        if pos + 4 > len(buf):
            raise XdrError(f"{self.name}: count needs 4 bytes at offset {pos}")
        n = _U32.unpack_from(buf, pos)[0]
        # every XDR item takes at least 4 bytes: a count beyond that is a lie
        if (self.maximum is not None and n > self.maximum) or n > (len(buf) - pos - 4) // 4:
            raise XdrError(
                f"{self.name}: count {n} at offset {pos} exceeds the maximum or the bytes left"
            )
        pos += 4
        unpack = self.of.unpack
        items = []
        for _ in range(n):
            item, pos = unpack(buf, pos)
            items.append(item)
        return items, pos


class Optional(XdrType):
    """*T: a bool then the value when present."""

    def __init__(self, of: XdrType, name: str | None = None):
        self.of = of
        self.name = name or f"*{of.name}"

    def pack(self, p, value):
        if value is None:
            p.buf += b"\0\0\0\0"
        else:
            p.buf += b"\0\0\0\1"
            self.of.pack(p, value)

    def unpack(self, buf, pos):
        present, pos = _PY_BOOL.unpack(buf, pos)
        if not present:
            return None, pos
        return self.of.unpack(buf, pos)


class LinkedList(XdrType):
    """The XDR idiom ``struct T { ...; T *next; }`` as a Python list: each item
    is preceded by TRUE and the list ends with FALSE (iterative, no recursion)."""

    def __init__(self, of: XdrType, name: str | None = None):
        self.of = of
        self.name = name or f"list of {of.name}"

    def pack(self, p, value):
        pack = self.of.pack
        for item in value:
            p.buf += b"\0\0\0\1"
            pack(p, item)
        p.buf += b"\0\0\0\0"

    def unpack(self, buf, pos):
        items: list[Any] = []
        while True:
            more, pos = _PY_BOOL.unpack(buf, pos)
            if not more:
                return items, pos
            item, pos = self.of.unpack(buf, pos)
            items.append(item)


class Struct(XdrType):
    """struct { fields }: decodes to an instance of ``self.cls`` (slotted)."""

    def __init__(self, name: str, *fields: tuple[str, XdrType]):
        self.name = name
        self.fields = fields
        names = tuple(f for f, _ in fields)
        self.cls = struct_class(name, names)
        self._types = tuple(t for _, t in fields)
        self._names = names

    def __call__(self, *args, **kwargs):
        return self.cls(*args, **kwargs)

    def pack(self, p, value):
        items: Sequence[Any]
        if isinstance(value, tuple):
            items = value
        else:
            items = [getattr(value, n) for n in self._names]
        if len(items) != len(self._types):
            raise XdrError(f"{self.name}: {len(items)} values for {len(self._types)} fields")
        for t, item in zip(self._types, items, strict=True):
            t.pack(p, item)

    def unpack(self, buf, pos):
        values = []
        for t in self._types:
            v, pos = t.unpack(buf, pos)
            values.append(v)
        return self.cls(*values), pos


class Union(XdrType):
    """union switch (disc) { case v: arm; ... default: arm }: (disc, value)."""

    def __init__(self, name: str, disc: XdrType, arms: dict, default: XdrType | None = None):
        self.name, self.disc, self.arms, self.default = name, disc, arms, default

    def arm(self, d) -> XdrType:
        t = self.arms.get(d, self.default)
        if t is None:
            raise XdrError(f"{self.name}: discriminant {d} has no arm (known: {sorted(self.arms)})")
        return t

    def pack(self, p, value):
        d, v = value
        self.disc.pack(p, d)
        self.arm(d).pack(p, v)

    def unpack(self, buf, pos):
        d, pos = self.disc.unpack(buf, pos)
        v, pos = self.arm(d).unpack(buf, pos)
        return (d, v), pos


# the names bound to the compiled classes when they are used (xdrcodec calls _Fixed "Fixed")
_NAMES = {
    "Packer": "Packer",
    "XdrType": "XdrType",
    "_Fixed": "Fixed",
    "Int": "Int",
    "UInt": "UInt",
    "Hyper": "Hyper",
    "UHyper": "UHyper",
    "Bool": "Bool",
    "Void": "Void",
    "Enum": "Enum",
    "FixedOpaque": "FixedOpaque",
    "Opaque": "Opaque",
    "String": "String",
    "Array": "Array",
    "Optional": "Optional",
    "LinkedList": "LinkedList",
    "Struct": "Struct",
    "Union": "Union",
}
PYTHON = SimpleNamespace(**{name: globals()[name] for name in _NAMES})


def _compiled_codec() -> ModuleType | None:
    if "0" in (os.environ.get("SHINGLE_NATIVE", "1"), os.environ.get("SHINGLE_NATIVE_XDR", "1")):
        return None
    try:
        from appliance.nfs.onc import xdrcodec
    except ImportError:  # not built (no compiler at install time)
        return None
    return xdrcodec


def _bind_compiled() -> str:
    codec = _compiled_codec()
    if codec is None:
        return "python"
    globals().update({name: getattr(codec, compiled) for name, compiled in _NAMES.items()})
    return "compiled"


IMPLEMENTATION = _bind_compiled()
