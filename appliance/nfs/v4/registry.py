"""The NFSv4 operation tables: operation number -> handler.

The ops modules (appliance.nfs.v4.ops) register their handlers here with
``@operation(OP_X)``; the COMPOUND executor looks each operation up in ``HANDLERS`` (one
dict lookup) and imports nothing from the ops modules. A handler gets the COMPOUND's
context (appliance.nfs.v4.context.Compound) and the operation's decoded arguments, and
returns the operation's resok value or raises NfsError.

``HANDLERS_40`` holds NFSv4.0's own version of an operation where RFC 7530 differs
(``@operation40(OP_X)``); the NFSv4.0 executor (compound40) tries it before ``HANDLERS``."""

from __future__ import annotations

from collections.abc import Callable

HANDLERS: dict[int, Callable] = {}
HANDLERS_40: dict[int, Callable] = {}


def operation(opnum: int) -> Callable[[Callable], Callable]:
    def register(fn: Callable) -> Callable:
        if opnum in HANDLERS:
            raise ValueError(f"operation {opnum} registered twice: {HANDLERS[opnum]} and {fn}")
        HANDLERS[opnum] = fn
        return fn

    return register


def operation40(opnum: int) -> Callable[[Callable], Callable]:
    def register(fn: Callable) -> Callable:
        if opnum in HANDLERS_40:
            raise ValueError(f"NFSv4.0 operation {opnum} registered twice")
        HANDLERS_40[opnum] = fn
        return fn

    return register
