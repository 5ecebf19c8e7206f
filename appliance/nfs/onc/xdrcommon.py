"""What both XDR implementations (appliance.nfs.onc.xdr's Python classes and the compiled
appliance.nfs.onc.xdrcodec) share, so that values and errors are the same whichever runs:
``except XdrError`` catches both, and a struct decodes to the same kind of slotted value."""

from __future__ import annotations

# Opaques at least this big are sent as their own chunk (scatter-gather) and decoded as
# memoryviews of the record (zero-copy).
BIG_CHUNK = 4096


class XdrError(ValueError):
    """Bytes that do not decode as the declared type."""


class StructValue:
    # each struct_class() subclass sets its field names here; the annotation says so for the
    # methods below, which read them
    __slots__: tuple[str, ...] = ()

    def __iter__(self):
        return (getattr(self, name) for name in self.__slots__)

    def __eq__(self, other):
        return type(other) is type(self) and tuple(self) == tuple(other)

    def __repr__(self):
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{type(self).__name__}({inner})"


def struct_class(name: str, names: tuple[str, ...]) -> type:
    """The slotted value class of struct ``name`` with fields ``names``, with a plain
    positional constructor."""
    args = ", ".join(names)
    body = "".join(f"    self.{f} = {f}\n" for f in names) or "    pass\n"
    ns: dict = {}
    exec(f"def __init__(self, {args}):\n{body}", ns)
    return type(name, (StructValue,), {"__slots__": names, "__init__": ns["__init__"]})
