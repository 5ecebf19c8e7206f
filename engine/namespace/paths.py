"""Paths and trees through the namespace API: absolute paths checked and split, a directory
listed page by page, a subtree walked or removed. Admin services (trash, retention, snapshots,
exports, tiering rules) use these; the NFS and SMB servers resolve names their own way."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from engine.base import errors
from engine.catalog.models import DIR
from engine.namespace.common import NAME_MAX, ROOT, Attr, DirEntry

if TYPE_CHECKING:
    from engine.namespace import Namespace

REMOVE_RETRIES = 20  # a directory refilled while it is removed is listed again this many times


def split_path(path: str, what: str = "path") -> list[str]:
    """Components of an absolute path; refuses relative paths, '.', '..' and NUL."""
    if not isinstance(path, str) or not path:
        raise errors.InvalidArgument(f"{what} {path!r}: expected a non-empty absolute path")
    if not path.startswith("/"):
        raise errors.InvalidArgument(
            f"{what} {path!r}: expected an absolute path starting with '/'"
        )
    if "\0" in path:
        raise errors.InvalidArgument(f"{what} {path!r}: contains a NUL character")
    parts = [p for p in path.split("/") if p]
    for part in parts:
        if part in (".", ".."):
            raise errors.InvalidArgument(f"{what} {path!r}: '{part}' components are not allowed")
        if len(part.encode("utf-8", "surrogateescape")) > NAME_MAX:
            raise errors.InvalidArgument(
                f"{what} {path!r}: component {part[:40]!r}... exceeds {NAME_MAX} bytes"
            )
    return parts


def join_path(parts: list[str] | tuple[str, ...]) -> str:
    return "/" + "/".join(parts)


def iter_dir(namespace: Namespace, dir_ino: int) -> Iterator[DirEntry]:
    """Every entry of a directory, page by page (cookies stay valid while it changes); never
    a dataset's .snapshots, even when listings show it: walks stay out of frozen trees."""
    cookie = 0
    while True:
        entries, eof = namespace.readdir(ROOT, dir_ino, cookie, show_snapshots=False)
        yield from entries
        if eof or not entries:
            return
        cookie = entries[-1].cookie


def walk_subtree(namespace: Namespace, attr: Attr) -> Iterator[Attr]:
    """``attr`` and everything below it; symbolic links are not followed."""
    stack = [attr]
    while stack:
        current = stack.pop()
        yield current
        if current.type == DIR:
            try:
                stack.extend(entry.attr for entry in iter_dir(namespace, current.ino))
            except (errors.StaleHandle, errors.NotFound):
                continue  # removed while we walked: nothing below it any more


def remove_tree(namespace: Namespace, dir_ino: int, name: str) -> int:
    """Remove ``name`` in ``dir_ino`` and its whole subtree through the namespace API.

    Returns the number of entries removed. Files still open keep their data until
    closed (the namespace frees an inode only when no name and no opener remain)."""
    top = namespace.lookup(ROOT, dir_ino, name)
    if top.type != DIR:
        namespace.unlink(ROOT, dir_ino, name)
        return 1
    removed = 0
    stack = [(dir_ino, name, top.ino)]
    attempts = 0
    while stack:
        parent, entry_name, ino = stack[-1]
        subdirs = []
        for entry in iter_dir(namespace, ino):
            if entry.attr.type == DIR:
                subdirs.append((ino, entry.name, entry.attr.ino))
            else:
                namespace.unlink(ROOT, ino, entry.name)
                removed += 1
        if subdirs:
            stack.extend(subdirs)
            continue
        try:
            namespace.rmdir(ROOT, parent, entry_name)
        except errors.NotEmpty:
            attempts += 1  # something was created meanwhile: list it again
            if attempts > REMOVE_RETRIES:
                raise
            continue
        removed += 1
        stack.pop()
    return removed
