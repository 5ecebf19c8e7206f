"""Random sequences of namespace operations against a small in-memory model.

Each example works in a fresh sandbox directory; after every operation the
outcome (success or errno) must match the model, and at the end every
listing and every link count must match too."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.base import errors
from engine.namespace import ROOT

NAMES = ["a", "b", "c", "d"]
_sandbox_ids = itertools.count()


class Model:
    def __init__(self):
        self.kids: dict[int, dict[str, int]] = {0: {}}  # dir id -> entries
        self.parent: dict[int, int] = {0: 0}
        self.files: set[int] = set()
        self.next_id = 1

    def is_dir(self, node):
        return node in self.kids

    def new(self, d, name, is_dir):
        if name in self.kids[d]:
            return "EEXIST"
        node = self.next_id
        self.next_id += 1
        if is_dir:
            self.kids[node] = {}
            self.parent[node] = d
        else:
            self.files.add(node)
        self.kids[d][name] = node
        return node

    def unlink(self, d, name):
        node = self.kids[d].get(name)
        if node is None:
            return "ENOENT"
        if self.is_dir(node):
            return "EISDIR"
        del self.kids[d][name]
        return None

    def rmdir(self, d, name):
        node = self.kids[d].get(name)
        if node is None:
            return "ENOENT"
        if not self.is_dir(node):
            return "ENOTDIR"
        if self.kids[node]:
            return "ENOTEMPTY"
        del self.kids[d][name]
        del self.kids[node]
        return None

    def link(self, d1, n1, d2, n2):
        node = self.kids[d1].get(n1)
        if node is None:
            return "ENOENT"
        if self.is_dir(node):
            return "EPERM"
        if n2 in self.kids[d2]:
            return "EEXIST"
        self.kids[d2][n2] = node
        return None

    def rename(self, d1, n1, d2, n2):
        node = self.kids[d1].get(n1)
        if node is None:
            return "ENOENT"
        if self.is_dir(node) and d1 != d2:
            walk = d2
            while True:
                if walk == node:
                    return "EINVAL"
                if walk == 0:
                    break
                walk = self.parent[walk]
        target = self.kids[d2].get(n2)
        if target is not None:
            if target == node:
                return None
            if self.is_dir(node):
                if not self.is_dir(target):
                    return "ENOTDIR"
                if self.kids[target]:
                    return "ENOTEMPTY"
            elif self.is_dir(target):
                return "EISDIR"
            if self.is_dir(target):
                del self.kids[target]
        del self.kids[d1][n1]
        self.kids[d2][n2] = node
        if self.is_dir(node):
            self.parent[node] = d2
        return None

    def links(self, node):
        if self.is_dir(node):
            return 2 + sum(1 for child in self.kids[node].values() if self.is_dir(child))
        return sum(
            1 for entries in self.kids.values() for child in entries.values() if child == node
        )


ERRNO_NAMES = {
    errors.Exists: "EEXIST",
    errors.NotFound: "ENOENT",
    errors.IsADirectory: "EISDIR",
    errors.NotADirectory: "ENOTDIR",
    errors.NotEmpty: "ENOTEMPTY",
    errors.NotPermitted: "EPERM",
    errors.InvalidArgument: "EINVAL",
}

op = st.one_of(
    st.tuples(st.just("create"), st.integers(0, 5), st.sampled_from(NAMES)),
    st.tuples(st.just("mkdir"), st.integers(0, 5), st.sampled_from(NAMES)),
    st.tuples(st.just("unlink"), st.integers(0, 5), st.sampled_from(NAMES)),
    st.tuples(st.just("rmdir"), st.integers(0, 5), st.sampled_from(NAMES)),
    st.tuples(
        st.just("rename"),
        st.integers(0, 5),
        st.sampled_from(NAMES),
        st.integers(0, 5),
        st.sampled_from(NAMES),
    ),
    st.tuples(
        st.just("link"),
        st.integers(0, 5),
        st.sampled_from(NAMES),
        st.integers(0, 5),
        st.sampled_from(NAMES),
    ),
)


def outcome(call, *args):
    try:
        return None, call(*args)
    except errors.FsError as exc:
        return ERRNO_NAMES.get(type(exc), f"unexpected {exc!r}"), None


@settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=st.lists(op, min_size=1, max_size=30))
def test_namespace_matches_model(namespace, ops):
    ns = namespace
    sandbox = ns.mkdir(ROOT, ns.root_ino, f"sandbox{next(_sandbox_ids)}")
    model = Model()
    ino_of = {0: sandbox.ino}  # model node -> inode

    def link_by_name(src_dir: int, src_name: str, dst_dir: int, dst_name: str):
        return ns.link(ROOT, ns.lookup(ROOT, src_dir, src_name).ino, dst_dir, dst_name)

    for step in ops:
        dirs = sorted(model.kids)  # existing directories, stable order
        kind, d1 = step[0], dirs[step[1] % len(dirs)]
        name = step[2]
        if kind in ("create", "mkdir"):
            expected = model.new(d1, name, kind == "mkdir")
            err, attr = outcome(getattr(ns, kind), ROOT, ino_of[d1], name)
            if isinstance(expected, int):
                assert err is None, (step, err)
                ino_of[expected] = attr.ino
            else:
                assert err == expected, (step, err, expected)
        elif kind in ("unlink", "rmdir"):
            expected = getattr(model, kind)(d1, name)
            err, _ = outcome(getattr(ns, kind), ROOT, ino_of[d1], name)
            assert err == expected, (step, err, expected)
        else:
            d2 = dirs[step[3] % len(dirs)]
            name2 = step[4]
            if kind == "rename":
                expected = model.rename(d1, name, d2, name2)
                err, _ = outcome(ns.rename, ROOT, ino_of[d1], name, ino_of[d2], name2)
            else:
                expected = model.link(d1, name, d2, name2)
                err, _ = outcome(link_by_name, ino_of[d1], name, ino_of[d2], name2)
            assert err == expected, (step, err, expected)
    for d, entries in model.kids.items():
        listing, eof = ns.readdir(ROOT, ino_of[d])
        assert eof
        assert sorted(e.name for e in listing) == sorted(entries), d
        for entry in listing:
            node = entries[entry.name]
            assert entry.attr.ino == ino_of[node]
            assert entry.attr.nlink == model.links(node), (
                entry.name,
                entry.attr.nlink,
                model.links(node),
            )
    assert ns.getattr(sandbox.ino).nlink == model.links(0)
