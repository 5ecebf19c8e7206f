"""The XDR codec's two implementations (appliance.nfs.onc.xdr's Python classes and the compiled
appliance.nfs.onc.xdrcodec) behave the same: every type the server declares (NFSv4.x, NFSv3,
MOUNT, NLM, NSM, portmap, the RPC header, the fattr4 attributes) is rebuilt with each
implementation's classes, then drawn values pack to the same chunks, decode to the same values,
and malformed bytes (mutated, truncated, lying lengths and counts, bad discriminants and bools)
meet the same XdrError with the same message. The module-level tests run on each implementation
(the ``impl`` fixture); the server tests of tests/nfs and tests/nfs3 run on the one
xdr.py chose (``SHINGLE_NATIVE_XDR=0`` for the Python one)."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from types import ModuleType, SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from xdr_strategies import mutated, strategy

from appliance.nfs import portmap
from appliance.nfs.nlm import types as nlm_types
from appliance.nfs.onc import rpc, xdr
from appliance.nfs.onc.xdrcommon import BIG_CHUNK, StructValue, XdrError
from appliance.nfs.v3 import types as v3_types
from appliance.nfs.v4 import attrs as fattr
from appliance.nfs.v4 import const as c
from appliance.nfs.v4 import types as v4_types

try:
    from appliance.nfs.onc import xdrcodec
except ImportError:  # not built: only the Python implementation is tested
    xdrcodec = None

IMPLS: dict[str, SimpleNamespace | ModuleType] = {"python": xdr.PYTHON}
if xdrcodec is not None:
    IMPLS["compiled"] = xdrcodec


@pytest.fixture(scope="module")
def _compiled_built():
    if xdrcodec is None:
        pytest.fail("appliance.nfs.onc.xdrcodec is not built: run `pip install -e .`")


needs_both = pytest.mark.usefixtures("_compiled_built")
SINGLETONS = ("Int", "UInt", "Hyper", "UHyper", "Bool", "Void")
# subclasses before their bases
KINDS = ("String", "Opaque", "FixedOpaque", "Enum", "Array", "Optional", "LinkedList", "Struct")


def mirror(t, impl, memo: dict | None = None):
    """The declaration ``t`` (of either implementation) rebuilt with ``impl``'s classes."""
    memo = {} if memo is None else memo
    if id(t) in memo:
        return memo[id(t)]
    made = _rebuild(t, impl, memo)
    memo[id(t)] = made
    return made


def _rebuild(t, impl, memo):
    for source in IMPLS.values():
        for name in SINGLETONS:
            if t is getattr(source, name):
                return getattr(impl, name)
    kind = next(
        (k for k in (*KINDS, "Union") for s in IMPLS.values() if isinstance(t, getattr(s, k))),
        None,
    )
    sub = lambda of: mirror(of, impl, memo)  # noqa: E731
    if kind in ("String", "Opaque"):
        return getattr(impl, kind)(t.maximum, t.name)
    if kind == "FixedOpaque":
        return impl.FixedOpaque(t.size, t.name)
    if kind == "Enum":
        return impl.Enum(t.name, t.values)
    if kind == "Array":
        return impl.Array(sub(t.of), t.maximum, t.name)
    if kind in ("Optional", "LinkedList"):
        return getattr(impl, kind)(sub(t.of), t.name)
    if kind == "Struct":
        return impl.Struct(t.name, *[(n, sub(ft)) for n, ft in t.fields])
    if kind == "Union":
        arms = {d: sub(arm) for d, arm in t.arms.items()}
        default = None if t.default is None else sub(t.default)
        return impl.Union(t.name, sub(t.disc), arms, default)
    raise TypeError(f"cannot rebuild {t!r}")


def declared_types() -> list:
    """Every XDR type the server's modules declare (module globals and their tables)."""
    found: dict[int, object] = {}
    bases = (xdr.XdrType, xdr.PYTHON.XdrType)

    def add(value):
        if isinstance(value, bases):
            found.setdefault(id(value), value)
        elif isinstance(value, dict):
            for item in value.values():
                add(item)
        elif isinstance(value, tuple) and value and isinstance(value[0], bases):
            add(value[0])  # fattr.ATTRS: (type, getter, settable)

    for module in (v4_types, v3_types, nlm_types, rpc, portmap, fattr):
        for value in vars(module).values():
            add(value)
    return list(found.values())


DECLARED = declared_types()
BY_NAME = {t.name: t for t in DECLARED}
# each declared type, rebuilt with each implementation
REBUILT = {name: [mirror(t, impl) for t in DECLARED] for name, impl in IMPLS.items()}


def plain(value):
    """A decoded value with both implementations' value classes compared by name and fields
    (and memoryviews kept apart from bytes: the shape is part of the behaviour)."""
    if isinstance(value, StructValue):
        return (type(value).__name__, tuple(plain(v) for v in value))
    if isinstance(value, memoryview):
        return ("memoryview", bytes(value))
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    return (type(value).__name__, value)


def raised(exc: Exception) -> tuple:
    """An XdrError with its message; another error (a value of the wrong shape for Python
    itself, as unpacking an int into two names) by its type: Python's own wording differs
    between the interpreter's and Cython's code paths."""
    return ("raised", type(exc).__name__, str(exc) if isinstance(exc, XdrError) else "")


def pack_outcome(t, impl, value):
    p = impl.Packer()
    try:
        t.pack(p, value)
    except Exception as exc:  # the exception is part of the behaviour compared
        return raised(exc)
    return ("packed", [bytes(chunk) for chunk in p.result()])


def unpack_outcome(t, data, pos=0):
    try:
        value, end = t.unpack(data, pos)
    except Exception as exc:
        return raised(exc)
    return ("unpacked", plain(value), end)


def same_everywhere(index: int, value, data_variants=()):
    """Pack ``value`` with declared type ``index`` in every implementation; the chunks, and
    the decoding of those bytes and of each variant, must agree."""
    outcomes = {name: pack_outcome(REBUILT[name][index], IMPLS[name], value) for name in IMPLS}
    first = next(iter(outcomes.values()))
    assert all(o == first for o in outcomes.values()), outcomes
    inputs = list(data_variants)
    if first[0] == "packed":
        inputs.insert(0, b"".join(first[1]))
    for data in inputs:
        decoded = {name: unpack_outcome(REBUILT[name][index], data) for name in IMPLS}
        one = next(iter(decoded.values()))
        assert all(d == one for d in decoded.values()), (DECLARED[index], data, decoded)
    return first


@pytest.fixture(params=list(IMPLS))
def impl(request):
    return IMPLS[request.param]


# -- every declared type, drawn values and mutated bytes ------------------------------------
@needs_both
@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_declared_type_packs_and_decodes_alike(data):
    index = data.draw(st.integers(0, len(DECLARED) - 1), label="type")
    t = DECLARED[index]
    value = data.draw(strategy(t), label="value")
    first = same_everywhere(index, value)
    assert first[0] == "packed", first  # drawn values are well-formed
    encoded = b"".join(first[1])
    variants = data.draw(st.lists(mutated([encoded]), min_size=1, max_size=4), label="mutated")
    same_everywhere(index, value, variants)
    # what decodes (drawn enums may be out of range) takes the whole encoding
    back = unpack_outcome(REBUILT["compiled"][index], encoded)
    assert back[0] == "raised" or back[2] == len(encoded), back


@needs_both
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_values_the_encoder_refuses_alike(data):
    """Out-of-range numbers, wrong types and lengths, unknown discriminants: same errors."""
    index = data.draw(st.integers(0, len(DECLARED) - 1), label="type")
    junk = st.one_of(
        st.integers(-(1 << 70), 1 << 70),
        st.none(),
        st.floats(allow_nan=False),
        st.text(max_size=3),
        st.binary(max_size=20),
        st.tuples(st.integers(-5, 5)),
        st.tuples(st.integers(-(1 << 33), 1 << 33), st.none()),
        st.lists(st.none(), max_size=3),
    )
    same_everywhere(index, data.draw(junk, label="junk"))


@needs_both
@pytest.mark.parametrize("index", range(len(DECLARED)), ids=[t.name for t in DECLARED])
def test_every_prefix_of_a_value_fails_alike(index):
    """Truncation at every byte of one drawn encoding of each type."""
    outcome = pack_outcome(REBUILT["python"][index], IMPLS["python"], _sample(DECLARED[index]))
    assert outcome[0] == "packed", outcome
    encoded = b"".join(outcome[1])
    for cut in range(len(encoded) + 1):
        decoded = {name: unpack_outcome(REBUILT[name][index], encoded[:cut]) for name in IMPLS}
        one = next(iter(decoded.values()))
        assert all(d == one for d in decoded.values()), (cut, decoded)


def _sample(t):
    """A deterministic, full-looking value of ``t``: every array and list has one item, every
    optional is present, every union takes its first arm."""
    if t in (xdr.Int, xdr.PYTHON.Int, xdr.Hyper, xdr.PYTHON.Hyper):
        return -7
    if t in (xdr.UInt, xdr.PYTHON.UInt, xdr.UHyper, xdr.PYTHON.UHyper):
        return 0x1234
    if t in (xdr.Bool, xdr.PYTHON.Bool):
        return True
    if t in (xdr.Void, xdr.PYTHON.Void):
        return None
    kind = next(
        k for k in (*KINDS, "Union") for s in IMPLS.values() if isinstance(t, getattr(s, k))
    )
    if kind == "String":
        return "n\u00e9"[: t.maximum]
    if kind == "Opaque":
        return b"abcde"[: t.maximum]
    if kind == "FixedOpaque":
        return bytes(range(t.size))
    if kind == "Enum":
        return min(t.values) if t.values else 3
    if kind in ("Array", "LinkedList"):
        return [_sample(t.of)]
    if kind == "Optional":
        return _sample(t.of)
    if kind == "Struct":
        return tuple(_sample(ft) for _, ft in t.fields)
    d = min(t.arms) if t.arms else 12345
    return (d, _sample(t.arm(d)))


# -- malformed input, by hand: the exact errors ------------------------------------------------
def _u32(*words: int) -> bytes:
    return struct.pack(f">{len(words)}I", *words)


MALFORMED = [
    ("nfs_fh4", _u32(0xFFFFFFFF), "nfs_fh4: length 4294967295 exceeds the maximum 128"),
    ("nfs_fh4", _u32(12) + b"abcd", "nfs_fh4: length 12 at offset 0 runs past the end (4 left)"),
    ("nfs_fh4", _u32(3) + b"abc", "nfs_fh4: length 3 at offset 0 runs past the end (3 left)"),
    ("nfs_fh4", b"\0\0", "nfs_fh4: length needs 4 bytes at offset 0"),
    (
        "bitmap4",
        _u32(0x40000000, 1),
        "bitmap4: count 1073741824 at offset 0 exceeds the maximum or the bytes left",
    ),
    (
        "bitmap4",
        _u32(65) + _u32(*range(65)),
        "bitmap4: count 65 at offset 0 exceeds the maximum or the bytes left",
    ),
    ("bitmap4", _u32(2, 1), "bitmap4: count 2 at offset 0 exceeds the maximum or the bytes left"),
    ("verifier4", b"1234567", "verifier4: needs 8 bytes at offset 0, 7 left"),
    ("stateid4", _u32(1) + b"x" * 11, "opaque[12]: needs 12 bytes at offset 4, 11 left"),
    ("settime4", _u32(1, 0, 5), "unsigned int: needs 4 bytes at offset 12, 0 left"),
    ("settime4", _u32(1, 0), "hyper: needs 8 bytes at offset 4, 4 left"),
    ("nfstime4", b"\0" * 11, "unsigned int: needs 4 bytes at offset 8, 3 left"),
    ("change_info4", _u32(2) + b"\0" * 16, "bool: value 2 at offset 0: expected 0 or 1"),
    ("change_info4", b"", "bool: needs 4 bytes at offset 0"),
    (
        "mountlist",
        _u32(1, 1, 0x61000000, 1, 0x62000000, 7),
        "bool: value 7 at offset 20: expected 0 or 1",
    ),
    ("mountlist", _u32(1, 1, 0x61000000, 1, 0x62000000), "bool: needs 4 bytes at offset 20"),
    ("exports", _u32(1, 1, 0x61000000, 0, 0), None),
]


@needs_both
@pytest.mark.parametrize(("name", "data", "message"), MALFORMED)
def test_malformed_bytes_meet_the_same_error(name, data, message):
    index = DECLARED.index(BY_NAME[name])
    decoded = {impl: unpack_outcome(REBUILT[impl][index], data) for impl in IMPLS}
    assert decoded["compiled"] == decoded["python"], decoded
    if message is None:
        assert decoded["python"][0] == "unpacked"
    else:
        assert decoded["python"] == ("raised", "XdrError", message)


def test_union_enum_and_bool_refusals(impl):
    u = impl.Union("u", impl.UInt, {1: impl.UInt, 2: impl.Void})
    with pytest.raises(xdr.XdrError, match=r"^u: discriminant 3 has no arm \(known: \[1, 2\]\)$"):
        u.decode(_u32(3, 0))
    with pytest.raises(xdr.XdrError, match=r"^u: discriminant 5 has no arm"):
        u.encode((5, None))
    assert u.decode(_u32(1, 9)) == (1, 9) and u.decode(_u32(2)) == (2, None)
    assert impl.Union("d", impl.UInt, {1: impl.UInt}, impl.Void).decode(_u32(77)) == (77, None)
    e = impl.Enum("e", [1, 2])
    with pytest.raises(xdr.XdrError, match=r"^e: value -1 is not one of \[1, 2\]$"):
        e.decode(_u32(0xFFFFFFFF))
    with pytest.raises(xdr.XdrError, match=r"^int: cannot encode 2147483648"):
        e.encode(1 << 31)
    with pytest.raises(xdr.XdrError, match=r"^\*unsigned int: 4 trailing bytes after the value$"):
        impl.Optional(impl.UInt).decode(_u32(1, 5, 6))
    assert impl.Optional(impl.UInt).decode(_u32(0)) is None
    with pytest.raises(xdr.XdrError, match=r"^bool: value 2 at offset 0: expected 0 or 1$"):
        impl.Optional(impl.UInt).decode(_u32(2, 5))


@pytest.mark.parametrize(
    ("type_name", "value"),
    [
        ("UInt", -1),
        ("UInt", 1 << 32),
        ("Int", 1 << 31),
        ("Int", -(1 << 31) - 1),
        ("Hyper", 1 << 63),
        ("UHyper", 1 << 64),
        ("UHyper", -1),
        ("UInt", 1.0),
        ("UHyper", None),
        ("Int", "1"),
    ],
)
def test_numbers_out_of_range_are_refused(impl, type_name, value):
    t = getattr(impl, type_name)
    with pytest.raises(xdr.XdrError) as caught:
        t.encode(value)
    assert str(caught.value) == f"{t.name}: cannot encode {value!r}: expected {t.lo}..{t.hi}"


def test_number_edges_round_trip(impl):
    for t in (impl.Int, impl.UInt, impl.Hyper, impl.UHyper):
        for v in (t.lo, t.lo + 1, 0, 1, t.hi - 1, t.hi, True):
            assert t.decode(t.encode(v)) == v
            assert t.encode(v) == struct.pack(t.codec.format, v)
    assert impl.UInt.encode(c.OP_GETATTR) == _u32(c.OP_GETATTR)


def test_opaques_strings_and_big_chunks(impl):
    o = impl.Opaque(None, "data")
    small, big = b"abcde", bytes(range(256)) * (BIG_CHUNK // 256) + b"xy"
    p = impl.Packer()
    o.pack(p, small)
    o.pack(p, big)
    impl.UInt.pack(p, 7)
    chunks = p.result()
    assert [type(ch) for ch in chunks] == [bytes, bytes, bytes]
    assert chunks[1] is big  # sent as its own chunk, not copied
    assert chunks[0] == _u32(5) + small + b"\0\0\0" + _u32(len(big))
    assert chunks[2] == b"\0\0" + _u32(7)
    record = b"".join(chunks)
    value, pos = o.unpack(record, 12)
    assert isinstance(value, memoryview) and value == big and value.obj is record
    assert (bytes(value), pos) == (big, len(record) - 4)
    assert o.unpack(record, 0) == (small, 12) and type(o.unpack(record, 0)[0]) is bytes
    with pytest.raises(xdr.XdrError, match=r"^opaque<3>: 5 bytes exceed the maximum 3$"):
        impl.Opaque(3).encode(small)
    with pytest.raises(xdr.XdrError, match=r"^opaque\[4\]: got 5 bytes, expected 4$"):
        impl.FixedOpaque(4).encode(small)
    for data in (bytearray(small), memoryview(small)):
        assert o.encode(data) == o.encode(small)
        assert impl.FixedOpaque(5).encode(data) == small + b"\0\0\0"
    s = impl.String(8)
    for text in ("", "abc", "\u00e9t\u00e9", "bad\udcff", "12345678"):
        assert s.decode(s.encode(text)) == text
    assert s.encode("\u00e9") == _u32(2) + "\u00e9".encode() + b"\0\0"
    assert s.encode(b"raw") == s.encode("raw")
    with pytest.raises(xdr.XdrError, match=r"^string<8>: 10 bytes exceed the maximum 8$"):
        s.encode("\u00e9" * 5)
    assert s.decode(_u32(2) + b"\xff\xfe\0\0") == "\udcff\udcfe"
    long = impl.String(None)
    assert long.decode(long.encode("x" * BIG_CHUNK)) == "x" * BIG_CHUNK


def test_struct_values_and_arrays(impl):
    point = impl.Struct("point", ("x", impl.Int), ("y", impl.Int))
    line = impl.Struct("line", ("a", point), ("b", point), ("tags", impl.Array(impl.UInt, 2)))
    value = line((1, 2), point(-3, 4), [5])
    decoded = line.decode(line.encode(value))
    assert decoded == line(point(1, 2), point(-3, 4), [5])
    assert isinstance(decoded, StructValue) and type(decoded) is line.cls
    assert repr(decoded.b) == "point(x=-3, y=4)" and tuple(decoded.a) == (1, 2)
    assert line.encode(decoded) == line.encode(((1, 2), (-3, 4), [5]))
    with pytest.raises(xdr.XdrError, match=r"^point: 3 values for 2 fields$"):
        point.encode((1, 2, 3))
    with pytest.raises(xdr.XdrError, match=r"^unsigned int<2>: 3 items exceed the maximum 2$"):
        line.encode(((1, 2), (3, 4), [1, 2, 3]))
    unset = point.cls.__new__(point.cls)
    unset.x = 1
    with pytest.raises(AttributeError):
        point.encode(unset)
    other = SimpleNamespace(x=8, y=9)  # any object with the fields
    assert point.encode(other) == _u32(8, 9)
    assert point.fields[1][0] == "y" and point.fields[1][1] is impl.Int
    empty = impl.Struct("empty")
    assert empty.decode(b"") == empty() and empty.encode(()) == b""
    linked = impl.LinkedList(point)
    assert linked.decode(linked.encode([(1, 2), (3, 4)])) == [point(1, 2), point(3, 4)]
    assert linked.encode([]) == _u32(0)


class _Doubled:
    """A Python subclass overriding pack and unpack: stored doubled on the wire."""

    @staticmethod
    def make(impl):
        class Doubled(impl.XdrType):
            name = "doubled"

            def pack(self, p, value):
                impl.UInt.pack(p, value * 2)

            def unpack(self, buf, pos):
                value, pos = impl.UInt.unpack(buf, pos)
                return value // 2, pos

        return Doubled()


def test_python_subclasses_nested_in_declared_types(impl):
    doubled = _Doubled.make(impl)
    assert doubled.name == "doubled" and repr(doubled) == "<xdr doubled>"
    pair = impl.Struct("pair", ("a", doubled), ("b", impl.Array(doubled)))
    assert pair.encode((3, [4, 5])) == _u32(6, 2, 8, 10)
    assert tuple(pair.decode(_u32(6, 2, 8, 10))) == (3, [4, 5])
    u = impl.Union("u", impl.UInt, {1: doubled})
    assert u.decode(u.encode((1, 21))) == (1, 21)

    class Named(impl.Opaque):  # a subclass that changes nothing but its class
        pass

    n = Named(4, "named")
    assert n.decode(n.encode(b"ab")) == b"ab"
    with pytest.raises(xdr.XdrError, match=r"^named: 5 bytes exceed the maximum 4$"):
        n.encode(b"abcde")


@needs_both
def test_a_python_unpack_cannot_move_the_compiled_cursor_outside_the_record():
    class Backwards(xdrcodec.XdrType):
        name = "backwards"

        def unpack(self, buf, pos):
            return None, -8

    pair = xdrcodec.Struct("pair", ("a", xdrcodec.UInt), ("b", Backwards()))
    with pytest.raises(
        xdr.XdrError, match=r"^backwards: unpack returned offset -8 outside 4\.\.8$"
    ):
        pair.decode(_u32(1, 2))


@needs_both
def test_a_subclass_that_skips_its_bases_init_fails_cleanly():
    class Lazy(xdrcodec.Struct):
        def __init__(self):
            pass

    class Hollow(xdrcodec.Array):
        def __init__(self):
            pass

    for t in (Lazy(), Hollow()):
        with pytest.raises(TypeError, match="base class's __init__"):
            t.decode(_u32(1, 2))
    with pytest.raises(TypeError, match="base class's __init__"):
        Hollow().encode([1])


def test_packer_can_be_rewound(impl):
    """compound.py takes a too-big reply back by editing the Packer's fields."""
    p = impl.Packer()
    impl.UInt.pack(p, 1)
    mark = (len(p.chunks), len(p.buf), p.size)
    impl.Opaque().pack(p, b"z" * BIG_CHUNK)
    assert len(p.chunks) == 2 and len(p) == 4 + 4 + BIG_CHUNK
    p.buf = bytearray(p.chunks[mark[0]][: mark[1]])
    del p.chunks[mark[0] :]
    p.size = mark[2]
    impl.UInt.pack(p, 2)
    assert p.getvalue() == _u32(1, 2)
    p.buf += b"\0\0\0\3"
    assert p.getvalue() == _u32(1, 2, 3)


@needs_both
def test_one_error_class_and_value_base():
    assert xdrcodec.XdrError is xdr.XdrError is XdrError
    assert xdrcodec.StructValue is xdr.StructValue
    assert xdrcodec.BIG_CHUNK == xdr.BIG_CHUNK
    with pytest.raises(xdr.XdrError, match="^unsigned int: needs 4 bytes at offset 0, 0 left$"):
        xdrcodec.UInt.decode(b"")
    with pytest.raises(xdr.XdrError, match="offset -4 is negative"):
        xdrcodec.UInt.unpack(b"abcd", -4)


def _implementation_with(env: dict) -> str:
    code = "from appliance.nfs.onc import xdr; print(xdr.IMPLEMENTATION, xdr.Struct.__module__)"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SHINGLE_NATIVE")}
    out = subprocess.run(
        [sys.executable, "-c", code], env={**environ, **env}, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_switches_choose_the_implementation():
    assert _implementation_with({"SHINGLE_NATIVE_XDR": "0"}) == "python appliance.nfs.onc.xdr"
    assert _implementation_with({"SHINGLE_NATIVE": "0"}) == "python appliance.nfs.onc.xdr"
    expected = "compiled appliance.nfs.onc.xdrcodec" if xdrcodec else "python appliance.nfs.onc.xdr"
    assert _implementation_with({}) == expected
