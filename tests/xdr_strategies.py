"""Hypothesis strategies for values of the server's own XDR declarations (appliance.nfs.onc.xdr),
for the fuzz tests of every NFSv4.1 operation and NFSv3 procedure: any declared type gets
well-formed values, with the edges of each number (0, the largest, 2^63 ...) drawn often, and
``overrides`` by type name for what must come from the running server (file handles,
stateids, names that exist)."""

from __future__ import annotations

from hypothesis import strategies as st

from appliance.nfs.onc import xdr

EDGES = (
    0,
    1,
    2,
    3,
    0x7F,
    0xFF,
    0x7FFF,
    0xFFFF,
    0x7FFFFFFF,
    0x80000000,
    0xFFFFFFFE,
    0xFFFFFFFF,
    (1 << 32),
    (1 << 53),
    (1 << 62),
    (1 << 63) - 1,
    (1 << 63),
    (1 << 64) - 2,
    (1 << 64) - 1,
    -1,
    -(1 << 31),
    -(1 << 63),
)
MAX_ITEMS = 3
MAX_BYTES = 96

# names a file system meets: real ones the fuzz setup creates, the special ones, the
# overlong, bytes that are not UTF-8 (decoded as the server's decoder does: surrogateescape)
names = st.one_of(
    st.sampled_from(
        [
            "f",
            "d",
            "sub",
            "link",
            "new",
            ".",
            "..",
            "",
            "a/b",
            "nul\0x",
            "x" * 256,
            "\u00e9t\u00e9",
            "../..",
            "f" * 255,
        ]
    ),
    st.binary(max_size=40).map(lambda b: b.decode("utf-8", "surrogateescape")),
    st.text(st.characters(exclude_categories=("Cs",)), max_size=20),
)


def integers(lo: int, hi: int) -> st.SearchStrategy[int]:
    edges = sorted({v for v in EDGES if lo <= v <= hi} | {lo, hi})
    return st.one_of(st.sampled_from(edges), st.integers(lo, hi))


def strategy(
    t: xdr.XdrType, overrides: dict[str, st.SearchStrategy] | None = None, _memo: dict | None = None
) -> st.SearchStrategy:
    """Values that ``t.pack`` accepts."""
    overrides = overrides or {}
    memo = {} if _memo is None else _memo
    if t.name in overrides:
        return overrides[t.name]
    if id(t) in memo:
        return memo[id(t)]
    made = _make(t, overrides, memo)
    memo[id(t)] = made
    return made


def _make(t, overrides, memo) -> st.SearchStrategy:
    def sub(of):
        return strategy(of, overrides, memo)

    if isinstance(t, xdr._Fixed):
        return integers(t.lo, t.hi)
    if t is xdr.Bool:
        return st.booleans()
    if t is xdr.Void:
        return st.none()
    if isinstance(t, xdr.Enum):
        anything = integers(-(1 << 31), (1 << 31) - 1)
        if t.values is None:
            return anything
        return st.one_of(st.sampled_from(sorted(t.values)), anything)
    if isinstance(t, xdr.FixedOpaque):
        return st.binary(min_size=t.size, max_size=t.size)
    if isinstance(t, xdr.String):
        if t.maximum is None:
            return names
        return names.filter(lambda s: len(s.encode("utf-8", "surrogateescape")) <= t.maximum)
    if isinstance(t, xdr.Opaque):
        return st.binary(max_size=min(t.maximum or MAX_BYTES, MAX_BYTES))
    if isinstance(t, xdr.Array):
        return st.lists(sub(t.of), max_size=min(t.maximum or MAX_ITEMS, MAX_ITEMS))
    if isinstance(t, xdr.LinkedList):
        return st.lists(sub(t.of), max_size=MAX_ITEMS)
    if isinstance(t, xdr.Optional):
        return st.one_of(st.none(), sub(t.of))
    if isinstance(t, xdr.Struct):
        return st.tuples(*(sub(field) for field in t._types))
    if isinstance(t, xdr.Union):
        arms = [st.tuples(st.just(d), sub(arm)) for d, arm in sorted(t.arms.items())]
        if t.default is not None:
            known = set(t.arms)
            lo, hi = (
                (t.disc.lo, t.disc.hi)
                if isinstance(t.disc, xdr._Fixed)
                else (-(1 << 31), (1 << 31) - 1)
            )  # an Enum: a signed int
            other = integers(lo, hi).filter(lambda d: d not in known)
            arms.append(st.tuples(other, sub(t.default)))
        return st.one_of(arms)
    raise TypeError(f"no strategy for XDR type {t!r}")


@st.composite
def mutated(draw, values: list[bytes]) -> bytes:
    """One of ``values`` with a byte changed, cut short or grown."""
    value = bytearray(draw(st.sampled_from(values)))
    how = draw(st.sampled_from(["flip", "cut", "grow"]))
    if how == "flip" and value:
        at = draw(st.integers(0, len(value) - 1))
        value[at] ^= draw(st.integers(1, 255))
    elif how == "cut":
        del value[draw(st.integers(0, len(value))) :]
    else:
        value += draw(st.binary(min_size=1, max_size=8))
    return bytes(value)
