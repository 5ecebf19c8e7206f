# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The XDR type classes of appliance.nfs.onc.xdr in C: the same declarations, values, bounds
and error messages, without a Python call per field.

A nested type is packed and unpacked by C-level calls (``_put`` / ``_get``) on a cursor over
the record's buffer, acquired once per top-level ``unpack``; words are read and written as
big-endian C integers straight into the record and the Packer's bytearray (no struct
module), and a struct's value is made by writing its slots, not by calling its
constructor. A Python subclass that overrides ``pack`` or ``unpack`` is honoured: nested
in a compiled type, it is called through its Python methods.

Why: on small NFS operations (creates, stats, removes) about a fifth of the server's
GIL-held time was the pure-Python codec (docs/ARCHITECTURE.md "Where the time goes")."""

import struct as _struct

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.number cimport PyNumber_Index
from cpython.object cimport PyObject_IsTrue
from cpython.ref cimport PyObject
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeUTF8, PyUnicode_GET_LENGTH
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memset

from appliance.nfs.onc.xdrcommon import BIG_CHUNK, StructValue, XdrError, struct_class

cdef extern from *:
    """
    #include "structmember.h"

    /* the offset of a __slots__ member in its instances, or -1 */
    static Py_ssize_t xdrc_slot_offset(PyObject *descr) {
        if (Py_TYPE(descr) != &PyMemberDescr_Type) return -1;
        PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
        if (m->type != T_OBJECT_EX || (m->flags & READONLY)) return -1;
        return m->offset;
    }
    /* a new, empty instance of a slotted class (what object.__new__ does) */
    static PyObject *xdrc_new_instance(PyObject *cls) {
        PyTypeObject *t = (PyTypeObject *)cls;
        return t->tp_alloc(t, 0);
    }
    static void xdrc_set_slot(PyObject *obj, Py_ssize_t offset, PyObject *value) {
        PyObject **slot = (PyObject **)((char *)obj + offset);
        Py_INCREF(value);
        Py_XSETREF(*slot, value);
    }
    /* borrowed; NULL when the slot is unset */
    static PyObject *xdrc_get_slot(PyObject *obj, Py_ssize_t offset) {
        return *(PyObject **)((char *)obj + offset);
    }
    """
    Py_ssize_t xdrc_slot_offset(object descr)
    object xdrc_new_instance(object cls)
    void xdrc_set_slot(object obj, Py_ssize_t offset, object value)
    PyObject *xdrc_get_slot(object obj, Py_ssize_t offset)

cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object o)
    const char *PyUnicode_UTF8_ASCII "(const char *)PyUnicode_DATA"(object o)

cdef Py_ssize_t BIG = BIG_CHUNK
cdef bytes TRUE_WORD = b"\0\0\0\1"
cdef bytes FALSE_WORD = b"\0\0\0\0"


# -- the record being decoded ----------------------------------------------------------------
cdef struct Cursor:
    const unsigned char *data
    Py_ssize_t n
    Py_ssize_t pos


cdef inline uint32_t read_u32(const unsigned char *d) noexcept nogil:
    return (<uint32_t>d[0] << 24) | (<uint32_t>d[1] << 16) | (<uint32_t>d[2] << 8) | d[3]


cdef inline uint64_t read_u64(const unsigned char *d) noexcept nogil:
    return (<uint64_t>read_u32(d) << 32) | read_u32(d + 4)


# -- the encoder ---------------------------------------------------------------------------
cdef class Packer:
    """Collects encoded bytes: small items in one bytearray, big payloads as
    separate chunks so a 1 MiB READ reply is never copied into a buffer."""

    cdef public bytearray buf
    cdef public list chunks
    cdef public Py_ssize_t size

    def __init__(self):
        self.buf = bytearray()
        self.chunks = []
        self.size = 0

    cpdef big(self, data):
        if PyByteArray_GET_SIZE(self.buf):
            self.size += PyByteArray_GET_SIZE(self.buf)
            self.chunks.append(bytes(self.buf))
            self.buf = bytearray()
        self.chunks.append(data)
        self.size += len(data)

    cpdef list result(self):
        """The encoded chunks (bytes-like), in order."""
        if PyByteArray_GET_SIZE(self.buf):
            self.size += PyByteArray_GET_SIZE(self.buf)
            self.chunks.append(bytes(self.buf))
            self.buf = bytearray()
        return self.chunks

    def getvalue(self) -> bytes:
        return b"".join(self.result())

    def __len__(self):
        return self.size + PyByteArray_GET_SIZE(self.buf)


cdef inline unsigned char *grow(Packer p, Py_ssize_t k) except NULL:
    """``k`` more bytes at the end of the Packer's buffer (bytearray over-allocates)."""
    cdef bytearray b = p.buf
    cdef Py_ssize_t n = PyByteArray_GET_SIZE(b)
    PyByteArray_Resize(b, n + k)
    return <unsigned char *>PyByteArray_AS_STRING(b) + n


cdef inline int put_u32(Packer p, uint32_t v) except -1:
    cdef unsigned char *d = grow(p, 4)
    d[0] = v >> 24
    d[1] = v >> 16
    d[2] = v >> 8
    d[3] = v
    return 0


cdef inline int put_u64(Packer p, uint64_t v) except -1:
    cdef unsigned char *d = grow(p, 8)
    cdef int i
    for i in range(8):
        d[i] = v >> (56 - 8 * i)
    return 0


cdef inline int put_bytes(Packer p, const char *src, Py_ssize_t n) except -1:
    """``n`` bytes then the zeros padding them to a multiple of 4."""
    cdef Py_ssize_t pad = (-n) & 3
    cdef unsigned char *d = grow(p, n + pad)
    memcpy(d, src, n)
    if pad:
        memset(d + n, 0, pad)
    return 0


cdef inline int put_pad(Packer p, Py_ssize_t n) except -1:
    cdef Py_ssize_t pad = (-n) & 3
    if pad:
        memset(grow(p, pad), 0, pad)
    return 0


# -- nested dispatch ---------------------------------------------------------------------------
cdef inline int write(XdrType t, Packer p, object value) except -1:
    if t is None:
        raise unset_type()
    if t.python_methods:
        t.pack(p, value)
        return 0
    return t._put(p, value)


cdef inline object read(XdrType t, Cursor *c, object buf):
    cdef Py_ssize_t end
    if t is None:
        raise unset_type()
    if t.python_methods:
        value, end = t.unpack(buf, c.pos)
        if end < c.pos or end > c.n:  # the cursor reads raw memory: never outside the record
            raise XdrError(f"{t.name}: unpack returned offset {end} outside {c.pos}..{c.n}")
        c.pos = end
        return value
    return t._get(c, buf)


cdef object unset_type():
    # a subclass's __init__ that did not call its base's leaves its parts None
    return TypeError("an XDR type's part is None: was the base class's __init__ called?")


# the classes of this module (cdef classes exist before the module's code runs)
cdef set COMPILED = set()
COMPILED.update(
    {
        XdrType,
        Fixed,
        BoolType,
        VoidType,
        Enum,
        FixedOpaque,
        Opaque,
        String,
        Array,
        Optional,
        LinkedList,
        Struct,
        Union,
    }
)


cdef class XdrType:
    cdef public object name
    # pack or unpack overridden by a Python subclass: nested values go through them
    cdef readonly bint python_methods

    def __cinit__(self, *args, **kwargs):
        self.name = "?"
        for klass in type(self).__mro__:
            if klass in COMPILED:
                self.python_methods = (
                    type(self).pack is not klass.pack or type(self).unpack is not klass.unpack
                )
                break
            if "name" in klass.__dict__:  # a class attribute of a Python subclass
                self.name = klass.__dict__["name"]

    cpdef pack(self, Packer p, value):
        self._put(p, value)

    cpdef unpack(self, buf, Py_ssize_t pos):
        cdef Py_buffer view
        cdef Cursor c
        PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
        try:
            if pos < 0:
                raise XdrError(f"{self.name}: offset {pos} is negative")
            c.data = <const unsigned char *>view.buf
            c.n = view.len
            c.pos = pos
            value = self._get(&c, buf)
        finally:
            PyBuffer_Release(&view)
        return value, c.pos

    cdef int _put(self, Packer p, object value) except -1:
        raise NotImplementedError

    cdef object _get(self, Cursor *c, object buf):
        raise NotImplementedError

    def encode(self, value) -> bytes:
        cdef Packer p = Packer()
        write(self, p, value)
        return p.getvalue()

    def decode(self, data, *, whole: bool = True):
        """Decode ``data``; with ``whole`` trailing bytes are an error."""
        value, pos = self.unpack(data, 0)
        if whole and pos != len(data):
            raise XdrError(f"{self.name}: {len(data) - pos} trailing bytes after the value")
        return value

    def __repr__(self):
        return f"<xdr {self.name}>"


# -- numbers ---------------------------------------------------------------------------------
cdef enum Kind:
    INT32, UINT32, INT64, UINT64

cdef dict KINDS = {">i": INT32, ">I": UINT32, ">q": INT64, ">Q": UINT64}


cdef class Fixed(XdrType):
    """int, unsigned int, hyper, unsigned hyper (``codec`` is their struct.Struct)."""

    cdef readonly object codec, lo, hi
    cdef readonly Py_ssize_t size
    cdef Kind kind

    def __init__(self, name: str, codec, lo: int, hi: int):
        self.name, self.codec, self.lo, self.hi = name, codec, lo, hi
        self.size = codec.size
        self.kind = KINDS[codec.format]

    cdef int _put(self, Packer p, object value) except -1:
        cdef int overflow = 0
        cdef long long x
        v = value
        if type(v) is not int:
            try:
                v = PyNumber_Index(v)
            except TypeError as exc:
                raise XdrError(self.refusal(value)) from exc
        x = PyLong_AsLongLongAndOverflow(v, &overflow)
        if self.kind == INT32:
            if overflow or x < -(1 << 31) or x >= (1 << 31):
                raise XdrError(self.refusal(value))
            return put_u32(p, <uint32_t><int32_t>x)
        if self.kind == UINT32:
            if overflow or x < 0 or x > 0xFFFFFFFF:
                raise XdrError(self.refusal(value))
            return put_u32(p, <uint32_t>x)
        if self.kind == INT64:
            if overflow:
                raise XdrError(self.refusal(value))
            return put_u64(p, <uint64_t>x)
        if overflow == 0 and x >= 0:
            return put_u64(p, <uint64_t>x)
        if overflow > 0 and v <= 0xFFFFFFFFFFFFFFFF:
            return put_u64(p, <uint64_t>v)
        raise XdrError(self.refusal(value))

    cdef str refusal(self, value):
        return f"{self.name}: cannot encode {value!r}: expected {self.lo}..{self.hi}"

    cdef object _get(self, Cursor *c, object buf):
        cdef const unsigned char *d = c.data + c.pos
        if c.pos + self.size > c.n:
            raise XdrError(
                f"{self.name}: needs {self.size} bytes at offset {c.pos}, {c.n - c.pos} left"
            )
        c.pos += self.size
        if self.kind == INT32:
            return <int32_t>read_u32(d)
        if self.kind == UINT32:
            return read_u32(d)
        if self.kind == INT64:
            return <int64_t>read_u64(d)
        return read_u64(d)


Int = Fixed("int", _struct.Struct(">i"), -(1 << 31), (1 << 31) - 1)
UInt = Fixed("unsigned int", _struct.Struct(">I"), 0, (1 << 32) - 1)
Hyper = Fixed("hyper", _struct.Struct(">q"), -(1 << 63), (1 << 63) - 1)
UHyper = Fixed("unsigned hyper", _struct.Struct(">Q"), 0, (1 << 64) - 1)
cdef Fixed INT = Int


cdef class BoolType(XdrType):
    def __init__(self):
        self.name = "bool"

    cdef int _put(self, Packer p, object value) except -1:
        return put_u32(p, 1 if PyObject_IsTrue(value) else 0)

    cdef object _get(self, Cursor *c, object buf):
        return read_bool(c)


cdef inline bint read_bool(Cursor *c) except -1:
    cdef uint32_t v
    if c.pos + 4 > c.n:
        raise XdrError(f"bool: needs 4 bytes at offset {c.pos}")
    v = read_u32(c.data + c.pos)
    if v > 1:
        raise XdrError(f"bool: value {v} at offset {c.pos}: expected 0 or 1")
    c.pos += 4
    return v == 1


Bool = BoolType()


cdef class VoidType(XdrType):
    def __init__(self):
        self.name = "void"

    cdef int _put(self, Packer p, object value) except -1:
        return 0

    cdef object _get(self, Cursor *c, object buf):
        return None


Void = VoidType()


cdef class Enum(XdrType):
    """A signed 32-bit enum; ``values`` restricts what decodes (None: any)."""

    cdef readonly object values

    def __init__(self, name: str, values=None):
        self.name = name
        self.values = frozenset(values) if values is not None else None

    cdef int _put(self, Packer p, object value) except -1:
        return INT._put(p, value)

    cdef object _get(self, Cursor *c, object buf):
        value = INT._get(c, buf)
        if self.values is not None and value not in self.values:
            raise XdrError(f"{self.name}: value {value} is not one of {sorted(self.values)}")
        return value


# -- opaque data and strings -------------------------------------------------------------------
cdef class FixedOpaque(XdrType):
    cdef readonly Py_ssize_t size, padded

    def __init__(self, size: int, name: str | None = None):
        self.size = size
        self.name = name or f"opaque[{size}]"
        self.padded = size + (-size) % 4

    cdef int _put(self, Packer p, object value) except -1:
        if len(value) != self.size:
            raise XdrError(f"{self.name}: got {len(value)} bytes, expected {self.size}")
        if type(value) is bytes:
            return put_bytes(p, PyBytes_AS_STRING(value), self.size)
        p.buf += value
        return put_pad(p, self.size)

    cdef object _get(self, Cursor *c, object buf):
        cdef Py_ssize_t start = c.pos
        if c.pos + self.padded > c.n:
            raise XdrError(
                f"{self.name}: needs {self.padded} bytes at offset {c.pos}, {c.n - c.pos} left"
            )
        c.pos += self.padded
        return PyBytes_FromStringAndSize(<const char *>c.data + start, self.size)


cdef class Opaque(XdrType):
    """Variable-length opaque<max>; decodes big values as memoryviews."""

    cdef readonly object maximum
    cdef Py_ssize_t limit  # the maximum, or -1 for none

    def __cinit__(self, *args, **kwargs):
        self.limit = -1

    def __init__(self, maximum: int | None = None, name: str | None = None):
        self.maximum = maximum
        self.limit = -1 if maximum is None else maximum
        self.name = name or (f"opaque<{maximum}>" if maximum else "opaque<>")

    cdef int put_data(self, Packer p, object value) except -1:
        cdef Py_ssize_t n
        if type(value) is bytes:
            n = PyBytes_GET_SIZE(value)
            self.check_length(n)
            put_u32(p, <uint32_t>n)
            if n < BIG:
                return put_bytes(p, PyBytes_AS_STRING(value), n)
            p.big(value)
            return put_pad(p, n)
        n = len(value)
        self.check_length(n)
        put_u32(p, <uint32_t>n)
        if n >= BIG:
            p.big(value)
        else:
            p.buf += value
        return put_pad(p, n)

    cdef int check_length(self, Py_ssize_t n) except -1:
        if self.limit >= 0 and n > self.limit:
            raise XdrError(f"{self.name}: {n} bytes exceed the maximum {self.maximum}")
        return 0

    cdef int _put(self, Packer p, object value) except -1:
        return self.put_data(p, value)

    cdef Py_ssize_t span(self, Cursor *c) except -1:
        """Checks the length word at the cursor and moves past the data: where it starts."""
        cdef Py_ssize_t pos = c.pos, start, n
        if pos + 4 > c.n:
            raise XdrError(f"{self.name}: length needs 4 bytes at offset {pos}")
        n = read_u32(c.data + pos)
        if self.limit >= 0 and n > self.limit:
            raise XdrError(f"{self.name}: length {n} exceeds the maximum {self.maximum}")
        start = pos + 4
        if start + n + ((-n) & 3) > c.n:
            raise XdrError(
                f"{self.name}: length {n} at offset {pos} runs past the end "
                f"({c.n - start} left)"
            )
        c.pos = start + n + ((-n) & 3)
        return start

    cdef object _get(self, Cursor *c, object buf):
        cdef Py_ssize_t start = self.span(c)
        cdef Py_ssize_t n = read_u32(c.data + start - 4)
        if n >= BIG:
            return memoryview(buf)[start : start + n]
        return PyBytes_FromStringAndSize(<const char *>c.data + start, n)


cdef class String(Opaque):
    """string<max>: UTF-8 text (surrogateescape keeps any bytes)."""

    def __init__(self, maximum: int | None = None, name: str | None = None):
        super().__init__(maximum, name or (f"string<{maximum}>" if maximum else "string<>"))

    cdef int _put(self, Packer p, object value) except -1:
        cdef Py_ssize_t n
        if type(value) is str and PyUnicode_IS_ASCII(value):
            n = PyUnicode_GET_LENGTH(value)
            if n < BIG:
                self.check_length(n)
                put_u32(p, <uint32_t>n)
                return put_bytes(p, PyUnicode_UTF8_ASCII(value), n)
        if isinstance(value, str):
            value = value.encode("utf-8", "surrogateescape")
        return self.put_data(p, value)

    cdef object _get(self, Cursor *c, object buf):
        cdef Py_ssize_t start = self.span(c)
        cdef Py_ssize_t n = read_u32(c.data + start - 4)
        return PyUnicode_DecodeUTF8(<char *>c.data + start, n, "surrogateescape")


# -- compositions ------------------------------------------------------------------------------
cdef class Array(XdrType):
    """T<max>: variable-length array."""

    cdef readonly XdrType of
    cdef readonly object maximum
    cdef Py_ssize_t limit  # the maximum, or -1 for none

    def __cinit__(self, *args, **kwargs):
        self.limit = -1

    def __init__(self, XdrType of, maximum: int | None = None, name: str | None = None):
        self.of, self.maximum = of, maximum
        self.limit = -1 if maximum is None else maximum
        self.name = name or f"{of.name}<{maximum or ''}>"

    cdef int _put(self, Packer p, object value) except -1:
        cdef Py_ssize_t n = len(value)
        if self.limit >= 0 and n > self.limit:
            raise XdrError(f"{self.name}: {n} items exceed the maximum {self.maximum}")
        put_u32(p, <uint32_t>n)
        for item in value:
            write(self.of, p, item)
        return 0

    cdef object _get(self, Cursor *c, object buf):
        cdef Py_ssize_t n, i
        cdef list items = []
        if c.pos + 4 > c.n:
            raise XdrError(f"{self.name}: count needs 4 bytes at offset {c.pos}")
        n = read_u32(c.data + c.pos)
        # every XDR item takes at least 4 bytes: a count beyond that is a lie
        if (self.limit >= 0 and n > self.limit) or n > (c.n - c.pos - 4) // 4:
            raise XdrError(
                f"{self.name}: count {n} at offset {c.pos} exceeds the maximum or the bytes left"
            )
        c.pos += 4
        for i in range(n):
            items.append(read(self.of, c, buf))
        return items


cdef class Optional(XdrType):
    """*T: a bool then the value when present."""

    cdef readonly XdrType of

    def __init__(self, XdrType of, name: str | None = None):
        self.of = of
        self.name = name or f"*{of.name}"

    cdef int _put(self, Packer p, object value) except -1:
        if value is None:
            return put_u32(p, 0)
        put_u32(p, 1)
        return write(self.of, p, value)

    cdef object _get(self, Cursor *c, object buf):
        if not read_bool(c):
            return None
        return read(self.of, c, buf)


cdef class LinkedList(XdrType):
    """The XDR idiom ``struct T { ...; T *next; }`` as a Python list: each item
    is preceded by TRUE and the list ends with FALSE (iterative, no recursion)."""

    cdef readonly XdrType of

    def __init__(self, XdrType of, name: str | None = None):
        self.of = of
        self.name = name or f"list of {of.name}"

    cdef int _put(self, Packer p, object value) except -1:
        for item in value:
            put_u32(p, 1)
            write(self.of, p, item)
        return put_u32(p, 0)

    cdef object _get(self, Cursor *c, object buf):
        cdef list items = []
        while read_bool(c):
            items.append(read(self.of, c, buf))
        return items


cdef class Struct(XdrType):
    """struct { fields }: decodes to an instance of ``self.cls`` (slotted)."""

    cdef readonly tuple fields, _types, _names
    cdef readonly object cls
    cdef Py_ssize_t count
    cdef Py_ssize_t *offsets  # of each field's slot in a ``cls`` instance

    def __init__(self, name: str, *fields):
        names = tuple(f for f, _ in fields)
        types = tuple(t for _, t in fields)
        for t in types:
            if not isinstance(t, XdrType):
                raise TypeError(f"{name}: field type {t!r} is not an XDR type")
        self.name = name
        self.fields = fields
        self.cls = struct_class(name, names)
        self._types = types
        self._names = names
        self.count = len(names)
        free(self.offsets)
        self.offsets = <Py_ssize_t *>malloc(max(self.count, 1) * sizeof(Py_ssize_t))
        if self.offsets == NULL:
            raise MemoryError()
        for i, n in enumerate(names):
            self.offsets[i] = xdrc_slot_offset(self.cls.__dict__[n])
            if self.offsets[i] < 0:
                raise TypeError(f"{name}: field {n} is not a slot of its value class")

    def __dealloc__(self):
        free(self.offsets)

    def __call__(self, *args, **kwargs):
        return self.cls(*args, **kwargs)

    cdef int _put(self, Packer p, object value) except -1:
        cdef Py_ssize_t i
        cdef PyObject *item
        if isinstance(value, tuple):
            if PyTuple_GET_SIZE(value) != self.count:
                raise XdrError(
                    f"{self.name}: {PyTuple_GET_SIZE(value)} values for {self.count} fields"
                )
            for i in range(self.count):
                write(
                    <XdrType>PyTuple_GET_ITEM(self._types, i),
                    p,
                    <object>PyTuple_GET_ITEM(value, i),
                )
            return 0
        if type(value) is self.cls:
            for i in range(self.count):
                item = xdrc_get_slot(value, self.offsets[i])
                if item == NULL:  # unset: the AttributeError getattr raises
                    getattr(value, <str>PyTuple_GET_ITEM(self._names, i))
                write(<XdrType>PyTuple_GET_ITEM(self._types, i), p, <object>item)
            return 0
        items = [getattr(value, n) for n in self._names]
        for i in range(self.count):
            write(<XdrType>PyTuple_GET_ITEM(self._types, i), p, items[i])
        return 0

    cdef object _get(self, Cursor *c, object buf):
        cdef Py_ssize_t i
        if self.cls is None:
            raise unset_type()
        value = xdrc_new_instance(self.cls)
        for i in range(self.count):
            xdrc_set_slot(
                value, self.offsets[i], read(<XdrType>PyTuple_GET_ITEM(self._types, i), c, buf)
            )
        return value


cdef class Union(XdrType):
    """union switch (disc) { case v: arm; ... default: arm }: (disc, value)."""

    cdef readonly XdrType disc
    cdef readonly dict arms
    cdef readonly object default

    def __init__(self, name: str, XdrType disc, dict arms, XdrType default=None):
        for t in arms.values():
            if not isinstance(t, XdrType):
                raise TypeError(f"{name}: arm type {t!r} is not an XDR type")
        self.name, self.disc, self.arms, self.default = name, disc, arms, default

    cpdef XdrType arm(self, d):
        t = self.arms.get(d, self.default)
        if t is None:
            raise XdrError(f"{self.name}: discriminant {d} has no arm (known: {sorted(self.arms)})")
        return <XdrType?>t

    cdef int _put(self, Packer p, object value) except -1:
        if type(value) is tuple and PyTuple_GET_SIZE(value) == 2:
            d = <object>PyTuple_GET_ITEM(value, 0)
            v = <object>PyTuple_GET_ITEM(value, 1)
        else:
            d, v = value
        write(self.disc, p, d)
        return write(self.arm(d), p, v)

    cdef object _get(self, Cursor *c, object buf):
        d = read(self.disc, c, buf)
        return (d, read(self.arm(d), c, buf))
