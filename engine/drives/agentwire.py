"""The wire protocol between a head and a drive agent (appliance/agent/): framed, binary, versioned.

Every message is one frame: a 16-byte header, then ``length`` bytes of body.

    magic  4s   b"SHAG"
    version B   VERSION (a peer speaking another version is refused, never guessed at)
    op     B    a request's operation; a reply carries ``op | REPLY``
    status H    0 in requests; in replies 0 for success, else the errno of the failure
    id     I    chosen by the requester; its reply carries the same id (replies may come out of
                order: an append is answered once durable, a read at once)
    length I    body bytes, at most MAX_BODY

Request bodies start with a fixed part (``REQUEST_LAYOUTS``): the drive's uuid as 16 bytes, then
the op's numbers; an APPEND's data follows its fixed part. A body whose length does not fit its
op is refused with EPROTO and the connection goes on (the frame's end is known); a header that
cannot be trusted (magic, version, a length over MAX_BODY) is answered and the connection is
closed, since where the next frame starts is unknown. Error replies carry a JSON body
``{"kind": "zone" | "missing" | "protocol" | "os", "message": ...}``."""

from __future__ import annotations

import errno
import json
import socket
import struct
import uuid as uuidlib
from typing import NamedTuple

MAGIC = b"SHAG"
VERSION = 1
HEADER = struct.Struct(">4sBBHII")
REPLY = 0x80
MAX_BODY = 64 << 20  # larger than any fragment (fragment sizes are at most a few MiB)
MAX_READ = MAX_BODY
ANY_OFFSET = (1 << 64) - 1  # an APPEND at the zone's write pointer, whatever it is (reply says)

HELLO, APPEND, READ, SYNC, REPORT, RESET, FINISH, OPEN, CLOSE, HEALTH = range(1, 11)
OP_NAMES = {
    HELLO: "hello",
    APPEND: "append",
    READ: "read",
    SYNC: "sync",
    REPORT: "report",
    RESET: "reset",
    FINISH: "finish",
    OPEN: "open",
    CLOSE: "close",
    HEALTH: "health",
}

# the fixed part of each request's body (after which only an APPEND has more: its data)
DRIVE = struct.Struct(">16s")
DRIVE_ZONE = struct.Struct(">16sI")
APPEND_FIXED = struct.Struct(">16sIQ")  # drive, zone, offset (ANY_OFFSET: at the pointer)
READ_FIXED = struct.Struct(">16sIQI")  # drive, zone, offset, length
APPEND_REPLY = struct.Struct(">QI")  # offset written at, bytes written (padded)
REQUEST_LAYOUTS: dict[int, struct.Struct | None] = {
    HELLO: None,
    APPEND: APPEND_FIXED,
    READ: READ_FIXED,
    SYNC: DRIVE_ZONE,
    REPORT: DRIVE,
    RESET: DRIVE_ZONE,
    FINISH: DRIVE_ZONE,
    OPEN: DRIVE_ZONE,
    CLOSE: DRIVE_ZONE,
    HEALTH: DRIVE,
}
# REPORT's reply: per zone its write pointer and a condition code
REPORT_ENTRY = struct.Struct(">QB")
CONDITIONS = ("empty", "implicit_open", "explicit_open", "closed", "full", "read_only", "offline")


class ProtocolError(OSError):
    """A frame that breaks the protocol (the peer's bug or a stranger on the port)."""

    def __init__(self, message: str):
        super().__init__(errno.EPROTO, message)


class Frame(NamedTuple):
    op: int
    status: int
    request_id: int
    body: bytes | bytearray | memoryview


def header(op: int, request_id: int, length: int, status: int = 0) -> bytes:
    return HEADER.pack(MAGIC, VERSION, op, status, request_id, length)


def parse_header(raw: bytes) -> tuple[int, int, int, int]:
    """(op, status, id, body length) of a frame header; ProtocolError if it cannot be trusted."""
    magic, version, op, status, request_id, length = HEADER.unpack(raw)
    if magic != MAGIC:
        raise ProtocolError(f"not a shingle agent frame (magic {magic!r}, expected {MAGIC!r})")
    if version != VERSION:
        raise ProtocolError(f"protocol version {version}; this side speaks {VERSION}")
    if length > MAX_BODY:
        raise ProtocolError(f"frame body of {length} bytes exceeds the limit of {MAX_BODY}")
    if op & ~REPLY not in OP_NAMES:
        raise ProtocolError(f"unknown operation {op & ~REPLY}")
    return op, status, request_id, length


def recv_exact(sock: socket.socket, length: int) -> bytearray:
    """``length`` bytes from ``sock``; ConnectionError if the peer closes first."""
    buf = bytearray(length)
    view = memoryview(buf)
    got = 0
    while got < length:
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError(f"peer closed the connection after {got} of {length} bytes")
        got += n
    return buf


def read_frame(sock: socket.socket) -> Frame:
    """The next frame; ConnectionError on a clean close before a header, ProtocolError on a
    header that cannot be trusted."""
    raw = recv_exact(sock, HEADER.size)
    op, status, request_id, length = parse_header(bytes(raw))
    return Frame(op, status, request_id, recv_exact(sock, length) if length else b"")


def send_frame(sock: socket.socket, op: int, request_id: int, *parts, status: int = 0) -> None:
    length = sum(len(p) for p in parts)
    sock.sendall(header(op, request_id, length, status))
    for part in parts:
        if len(part):
            sock.sendall(part)


def split_request(op: int, body) -> tuple[tuple, memoryview]:
    """The fixed fields of a request body and what follows them (an APPEND's data); a body
    whose length does not fit ``op`` raises ProtocolError."""
    layout = REQUEST_LAYOUTS[op]
    size = layout.size if layout is not None else 0
    if op == APPEND:
        if len(body) < size:
            raise ProtocolError(
                f"append body of {len(body)} bytes is shorter than its {size}-byte fixed part"
            )
    elif len(body) != size:
        raise ProtocolError(f"{OP_NAMES[op]} body of {len(body)} bytes; expected {size}")
    view = memoryview(body)
    fields = layout.unpack_from(view) if layout is not None else ()
    return fields, view[size:]


def drive_key(drive_uuid: str) -> bytes:
    """A drive's uuid as the 16 bytes a request carries."""
    return uuidlib.UUID(drive_uuid).bytes


def drive_name(key: bytes) -> str:
    return str(uuidlib.UUID(bytes=bytes(key)))


def error_body(kind: str, message: str) -> bytes:
    return json.dumps({"kind": kind, "message": message}).encode()


def parse_error(status: int, body) -> tuple[str, str]:
    """(kind, message) of an error reply; a body that is not the JSON expected still gives a
    message."""
    try:
        data = json.loads(bytes(body))
        return str(data.get("kind", "os")), str(data.get("message", ""))
    except (ValueError, AttributeError):
        return "os", bytes(body)[:200].decode("utf-8", "replace")
