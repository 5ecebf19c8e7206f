# The compiled XDR codec (xdrcodec.pyx): the classes of appliance.nfs.onc.xdr, in C.
import struct
from typing import Any

from appliance.nfs.onc.xdrcommon import BIG_CHUNK as BIG_CHUNK
from appliance.nfs.onc.xdrcommon import StructValue as StructValue
from appliance.nfs.onc.xdrcommon import XdrError as XdrError

class Packer:
    buf: bytearray
    chunks: list[Any]
    size: int
    def big(self, data: Any) -> None: ...
    def result(self) -> list[Any]: ...
    def getvalue(self) -> bytes: ...
    def __len__(self) -> int: ...

class XdrType:
    name: Any
    python_methods: bool
    def pack(self, p: Packer, value: Any) -> None: ...
    def unpack(self, buf: Any, pos: int) -> tuple[Any, int]: ...
    def encode(self, value: Any) -> bytes: ...
    def decode(self, data: Any, *, whole: bool = True) -> Any: ...

class Fixed(XdrType):
    codec: struct.Struct
    lo: int
    hi: int
    size: int
    def __init__(self, name: str, codec: struct.Struct, lo: int, hi: int) -> None: ...

class BoolType(XdrType): ...
class VoidType(XdrType): ...

class Enum(XdrType):
    values: frozenset[int] | None
    def __init__(self, name: str, values: Any = None) -> None: ...

class FixedOpaque(XdrType):
    size: int
    padded: int
    def __init__(self, size: int, name: str | None = None) -> None: ...

class Opaque(XdrType):
    maximum: int | None
    def __init__(self, maximum: int | None = None, name: str | None = None) -> None: ...

class String(Opaque): ...

class Array(XdrType):
    of: XdrType
    maximum: int | None
    def __init__(
        self, of: XdrType, maximum: int | None = None, name: str | None = None
    ) -> None: ...

class Optional(XdrType):
    of: XdrType
    def __init__(self, of: XdrType, name: str | None = None) -> None: ...

class LinkedList(XdrType):
    of: XdrType
    def __init__(self, of: XdrType, name: str | None = None) -> None: ...

class Struct(XdrType):
    fields: tuple[tuple[str, XdrType], ...]
    cls: type
    def __init__(self, name: str, *fields: tuple[str, XdrType]) -> None: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

class Union(XdrType):
    disc: XdrType
    arms: dict[int, XdrType]
    default: XdrType | None
    def __init__(
        self, name: str, disc: XdrType, arms: dict[int, XdrType], default: XdrType | None = None
    ) -> None: ...
    def arm(self, d: int) -> XdrType: ...

Int: Fixed
UInt: Fixed
Hyper: Fixed
UHyper: Fixed
Bool: BoolType
Void: VoidType
