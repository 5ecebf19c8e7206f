"""Helpers the NFSv4.1 operations of several areas share."""

from __future__ import annotations

from appliance.nfs.state import NfsError
from appliance.nfs.v4 import attrs as fattr
from appliance.nfs.v4 import const as c
from appliance.nfs.v4.context import Node
from appliance.nfs.v4.types import RESULTS, change_info4
from engine.base import errors
from engine.catalog.models import DIR, LNK
from engine.namespace import SET_TO_NOW, check_name


def resok(op: int):
    """The resok type of an operation's result."""
    return RESULTS[op].arms[c.NFS4_OK]


def is_utf8(text: str) -> bool:
    """Whether decoded XDR text was UTF-8: the decoder keeps other bytes as surrogates."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_component(name: str) -> str:
    if not name:
        raise NfsError(c.NFS4ERR_INVAL, "empty name")
    if not name.isascii() and not is_utf8(name):
        raise NfsError(c.NFS4ERR_INVAL, "name is not UTF-8")  # RFC 8881 14.3
    try:
        check_name(name)
    except errors.NameTooLong as exc:
        raise NfsError(c.NFS4ERR_NAMETOOLONG, str(exc)) from None
    except errors.InvalidArgument as exc:
        raise NfsError(c.NFS4ERR_BADNAME, str(exc)) from None
    return name


def need_dir(cx) -> Node:
    node = cx.need_fh()
    if node.pseudo is None:
        attr = cx.ns.getattr(node.ino)
        if attr.type != DIR:
            raise NfsError(
                c.NFS4ERR_SYMLINK if attr.type == LNK else c.NFS4ERR_NOTDIR, "not a directory"
            )
    return node


def apply_attrs(cx, node: Node, values: dict, *, skip=()) -> list[int]:
    """namespace.setattr for decoded fattr4 values; returns the bits set."""
    values = {bit: v for bit, v in values.items() if bit not in skip}
    if not values:
        return []
    kw = fattr.setattr_kwargs(values, SET_TO_NOW, cx.server.idmap_domain)
    cx.ns.setattr(cx.cred(node), node.ino, **kw)
    return sorted(values)


def cinfo(before, after):
    return change_info4.cls(False, before, after)
