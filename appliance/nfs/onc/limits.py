"""Limits that keep hostile or broken clients from holding the server's memory and
connections: the record size (also the bound of a reply), buffered request bytes per
connection and in all, the number of connections, the operations in one COMPOUND, what the
NFSv4.1 session slots keep of replies, and the timeouts the connection sweep applies.

A record mark is a promise, not an allocation: a connection's buffers grow with
the bytes that have arrived (in its buffer or in the kernel's receive queue),
and every byte it holds for requests, from the first byte of a record until
its call is answered, is counted against its own budget and the server's.
Past either budget the connection stops reading, so TCP pushes back on the
client; it reads again as its calls are answered."""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
SCAN_BUFFER_MAX = 256 * KiB  # a connection's scan buffer grows up to this (connection.py)


@dataclass(frozen=True)
class NetLimits:
    """The network limits of one server (``[nfs]`` in the config file)."""

    max_record_size: int = 4 * MiB + 64 * KiB  # longer records close the connection
    max_connections: int = 4096  # past it, new connections are closed at once
    initial_buffer: int = 16 * KiB  # each connection's receive buffer to start with
    connection_budget: int = 64 * MiB  # request bytes one connection may hold
    total_budget: int = 1 * GiB  # request bytes all connections together may hold
    idle_timeout: float = 300.0  # a connection holding no state, silent that long, closes
    session_idle_timeout: float = 3600.0  # the same for one with an NFSv4.1 session bound
    record_timeout: float = 30.0  # a record begun and not complete that long closes
    # operations in one COMPOUND: NFSv4.0 answers more with NFS4ERR_RESOURCE, an NFSv4.1
    # session's ca_maxoperations is at most this (appliance.nfs.v4.compound40, ops/session.py)
    max_compound_ops: int = 64
    # what the NFSv4.1 session slots keep of replies, all sessions together
    # (appliance.nfs.state.replies)
    slot_replies_bytes: int = 64 * MiB

    def __post_init__(self) -> None:
        if self.connection_budget < self.max_record_size + SCAN_BUFFER_MAX:
            raise ValueError(
                f"connection budget {self.connection_budget} is below the record "
                f"size {self.max_record_size} + {SCAN_BUFFER_MAX}: a whole record "
                "could never arrive"
            )
        if self.total_budget < self.connection_budget:
            raise ValueError(
                f"total budget {self.total_budget} is below one connection's "
                f"budget {self.connection_budget}"
            )
        if self.initial_buffer < 1024:
            raise ValueError(f"initial buffer {self.initial_buffer}: at least 1024 bytes")
        if self.max_compound_ops < 2:  # SEQUENCE and one operation (RFC 8881 18.36.3)
            raise ValueError(f"max_compound_ops {self.max_compound_ops}: at least 2")

    @classmethod
    def from_config(cls, config) -> NetLimits:
        """The ``[nfs]`` limits of a loaded appliance.config.Config."""
        get = config.get
        return cls(
            max_record_size=get("nfs.max_record_size"),
            max_connections=get("nfs.max_connections"),
            initial_buffer=get("nfs.initial_buffer"),
            connection_budget=get("nfs.connection_budget"),
            total_budget=get("nfs.total_budget"),
            idle_timeout=get("nfs.idle_timeout_seconds"),
            session_idle_timeout=get("nfs.session_idle_timeout_seconds"),
            record_timeout=get("nfs.record_timeout_seconds"),
            max_compound_ops=get("nfs.max_compound_ops"),
            slot_replies_bytes=get("nfs.slot_replies_mib") * MiB,
        )

    @property
    def sweep_period(self) -> float:
        """How often the sweep looks at every connection: a timeout is exceeded by at most
        this much."""
        return max(0.05, min(1.0, self.idle_timeout / 4, self.record_timeout / 4))


class RequestBudget:
    """Request bytes held by all connections (taken on the event loop, given back there
    or by worker threads), and the connections waiting for some to be given back."""

    def __init__(self, limit: int):
        self.limit = limit
        self.held = 0
        self.taken = 0  # in all, ever: it moves while requests arrive (runtime.HeapTrim)
        self._lock = threading.Lock()
        self.waiting: set = set()  # connections paused until the total drops

    def try_take(self, n: int) -> bool:
        with self._lock:
            if self.held + n > self.limit:
                return False
            self.held += n
            self.taken += n
            return True

    def take(self, n: int) -> None:
        """Bytes that are already in memory (copied out of a receive buffer)."""
        with self._lock:
            self.held += n
            self.taken += n

    def give(self, n: int) -> bool:
        """True when connections wait for bytes and this brought the total under the limit."""
        with self._lock:
            self.held -= n
            return bool(self.waiting) and self.held < self.limit


class ReceiveBuffers:
    """Buffers for big fragments (WRITEs of up to ``capacity`` bytes), kept and used again once
    nothing refers to them: a new bytearray per 1 MiB WRITE is zeroed and page-faulted in, and
    grown by copies as the fragment arrives. Used on the event loop only; a buffer is free when
    the pool's list holds the only reference (the WRITE's data is a memoryview of it until the
    call is done, and a memoryview holds a reference). At most ``count`` buffers exist; past
    that, and for longer fragments, a connection allocates its own as before."""

    def __init__(self, capacity: int = 1 * MiB + 64 * KiB, count: int = 16):
        self.capacity = capacity
        self.count = count
        self.buffers: list[bytearray] = []

    def take(self, length: int) -> bytearray | None:
        """A buffer of at least ``length`` bytes nothing else uses, or None."""
        if length > self.capacity:
            return None
        for buf in self.buffers:
            # references: the list's, the loop variable's and getrefcount's argument
            if sys.getrefcount(buf) == 3:
                return buf
        if len(self.buffers) >= self.count:
            return None
        buf = bytearray(self.capacity)
        self.buffers.append(buf)
        return buf

    def in_use(self) -> int:
        return sum(1 for buf in self.buffers if sys.getrefcount(buf) > 3)
