"""A file freed under a reader reads as gone (ESTALE), never as zeros."""

from __future__ import annotations

import pytest

from engine.base import errors
from engine.namespace import ROOT


def test_read_of_freed_inode_is_stale_not_a_hole(sqlite_engine):
    ns, data = sqlite_engine.ns, sqlite_engine.data
    f = ns.create(ROOT, ns.root_ino, "f")
    ns.write(f.ino, 0, b"\x01" * 100_000, stable=True)
    size = ns.getattr(f.ino).size
    ns.unlink(ROOT, ns.root_ino, "f")  # nobody holds it open: freed now
    # a reader that looked the file up just before the unlink goes on with its read
    with pytest.raises(errors.StaleHandle):
        data.read(f.ino, 0, size, size)
