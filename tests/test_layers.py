"""The layers of docs/ARCHITECTURE.md, checked on every import statement (also those inside
functions): engine/ imports neither appliance/ nor webui/ (migrations/ only to find its
scripts); appliance/ does not import webui/ (it starts the web UI as a child process); webui/
reaches appliance/ only through appliance/facade.py; migrations/ use engine/ only. Inside
appliance/nfs, the state layer (appliance/nfs/state) is reached through its face and uses no
more of v4/ than the protocol's numbers and XDR types."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "appliance", "webui", "migrations")


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, dotted module) of every import in the file, relative imports made absolute."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            # `from appliance import facade` names a module: count it as appliance.facade
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def violations(package: str, allowed) -> list[str]:
    out = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for line, module in imports_of(path):
            top = module.split(".")[0]
            if top in PACKAGES and top != package and not allowed(module):
                out.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return out


RULES = {
    # the catalog finds its Alembic scripts through the migrations package (its folder only)
    "engine": lambda module: module == "migrations",
    "appliance": lambda module: module.split(".")[0] == "engine",
    "webui": lambda module: (
        module.split(".")[0] == "engine"
        or module == "appliance.facade"
        or module.startswith("appliance.facade.")
    ),
    "migrations": lambda module: module.split(".")[0] == "engine",
}


@pytest.mark.parametrize("package", sorted(RULES))
def test_imports_point_down_the_layers(package):
    bad = violations(package, RULES[package])
    assert not bad, f"{package}/ reaches past its layer:\n" + "\n".join(bad)


def test_the_check_sees_a_forbidden_import(tmp_path, monkeypatch):
    """The rule is not vacuous: a lazy import of appliance.status inside webui/ is caught."""
    fake = tmp_path / "webui"
    fake.mkdir()
    (fake / "page.py").write_text("def f():\n    from appliance.status import gather\n")
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    found = violations("webui", RULES["webui"])
    assert found == ["webui/page.py:2 imports appliance.status.gather"]


# The NFS state layer (appliance/nfs/state) sits between the NFSv4 wire declarations and the
# protocols that keep state (v4/ and nlm/): it may use v4's numbers and XDR types, nothing
# else of v4/; the rest of appliance/nfs reaches it through its face (the package's own
# exports and its two modules of rules, clients and v40), never its internal parts
NFS_STATE = "appliance.nfs.state"
STATE_MAY_USE_OF_V4 = ("appliance.nfs.v4.const", "appliance.nfs.v4.types")
STATE_FACE_MODULES = {"clients", "v40"}


def nfs_state_violations() -> list[str]:
    state_dir = ROOT / "appliance" / "nfs" / "state"
    internal = {p.stem for p in state_dir.glob("*.py")} - {"__init__"} - STATE_FACE_MODULES
    out = []
    for path in sorted((ROOT / "appliance").rglob("*.py")):
        inside = state_dir in path.parents
        for line, module in imports_of(path):
            where = f"{path.relative_to(ROOT)}:{line} imports {module}"
            if inside:
                if module.startswith("appliance.nfs.") and not module.startswith(
                    (f"{NFS_STATE}.", "appliance.nfs.onc.", *STATE_MAY_USE_OF_V4)
                ):
                    out.append(where)
            elif module.startswith(f"{NFS_STATE}."):
                if module[len(NFS_STATE) + 1 :].split(".")[0] in internal:
                    out.append(where)
    return out


def test_the_nfs_state_layer_keeps_to_its_place():
    bad = nfs_state_violations()
    assert not bad, "the NFS state layer is reached past its face, or reaches up:\n" + "\n".join(
        bad
    )


def test_the_nfs_state_check_sees_both_ways_past_it(tmp_path, monkeypatch):
    """Not vacuous: the state importing an NFSv4 operation, and an operation importing a part
    of the state table, are both caught; the face and v4's types are not."""
    state = tmp_path / "appliance" / "nfs" / "state"
    ops = tmp_path / "appliance" / "nfs" / "v4" / "ops"
    state.mkdir(parents=True)
    ops.mkdir(parents=True)
    (state / "locks.py").write_text(
        "from appliance.nfs.v4.types import LOCK4denied\nfrom appliance.nfs.v4.ops import io\n"
    )
    (ops / "io.py").write_text(
        "from appliance.nfs.state import NfsError, v40\n"
        "from appliance.nfs.state.locks import lock_range\n"
    )
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    assert nfs_state_violations() == [
        "appliance/nfs/state/locks.py:2 imports appliance.nfs.v4.ops.io",
        "appliance/nfs/v4/ops/io.py:2 imports appliance.nfs.state.locks.lock_range",
    ]


def module_graph(packages) -> dict[str, set[str]]:
    """Module -> the project modules it imports (a name imported from a package counts as
    that package's module when one exists, else as the package)."""
    modules = {}
    for package in packages:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = {known(module) for _line, module in imports_of(path)}
        graph[name] = {t for t in targets if t and t != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle():
    """A type-only edge counts too: it becomes a small Protocol (appliance/nfs/v4/attrs.py)."""
    assert circles(module_graph(["engine", "appliance", "webui"])) == []


def test_the_circle_check_sees_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
