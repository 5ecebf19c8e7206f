"""Every third-party module the code imports comes from a distribution pyproject.toml names
itself: engine/appliance/webui/migrations from [project] dependencies (what an installed
appliance's venv gets), tests from those and the test extra, bench from those and the test
and bench extras. A module that arrives only as another package's dependency (packaging
through pytest, trio through pyfuse3) works here and breaks the day that package drops it,
or in a venv built without the test extra (`shingle install` then failed on
`import packaging`). An import inside ``try: ... except ImportError`` (or
``pytest.importorskip``) is optional and not counted."""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import re
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
LOCAL = {"engine", "appliance", "webui", "migrations", "tests", "bench", "conftest"}
# tests/ and bench/ put their own folder on sys.path: their helper modules are local too
HELPER_FOLDERS = ("tests", "bench")
AREAS = {
    # folder: the extras whose distributions it may import (besides [project] dependencies)
    "engine": (),
    "appliance": (),
    "webui": (),
    "migrations": (),
    "tests": ("test",),
    "bench": ("test", "bench"),
}


def _catches_import_error(node: ast.Try) -> bool:
    for handler in node.handlers:
        names = ast.unparse(handler.type) if handler.type else ""
        if "ImportError" in names or "ModuleNotFoundError" in names:
            return True
    return False


def _imports(statements: list[ast.stmt], optional: bool, found: dict[str, bool]) -> None:
    """Statements only (imports are statements): ``found`` maps each top-level module name to
    whether an import of it is optional."""
    for node in statements:
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            top = name.split(".")[0]
            found[top] = found.get(top, False) or optional
        inner = optional or (isinstance(node, ast.Try) and _catches_import_error(node))
        for field in ("body", "orelse", "finalbody"):
            _imports(getattr(node, field, []), inner if field == "body" else optional, found)
        for handler in getattr(node, "handlers", []):
            _imports(handler.body, optional, found)
        for case in getattr(node, "cases", []):
            _imports(case.body, optional, found)


def imported_modules(path: Path) -> set[str]:
    """Top-level names of the modules ``path`` needs: absolute imports and
    ``importlib.import_module`` of a literal name, less those it imports under ``except
    ImportError`` somewhere (a file that probes for a module imports it again where the
    probe found it)."""
    text = path.read_text()
    found: dict[str, bool] = {}
    _imports(ast.parse(text, str(path)).body, False, found)
    for name in re.findall(r"import_module\(\s*[\"']([\w.]+)[\"']", text):
        found.setdefault(name.split(".")[0], False)
    return {name for name, optional in found.items() if not optional}


def declared(extras: tuple[str, ...]) -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    texts = list(project["dependencies"])
    for extra in extras:
        texts += project["optional-dependencies"][extra]
    return {canonicalize_name(Requirement(text).name) for text in texts}


def local_helpers() -> set[str]:
    names = set(LOCAL)
    for folder in HELPER_FOLDERS:
        for path in (ROOT / folder).rglob("*"):
            names.add(path.stem if path.suffix == ".py" else path.name)
    return names


def undeclared_imports() -> list[str]:
    providers = metadata.packages_distributions()
    local = local_helpers()
    problems = []
    for area, extras in AREAS.items():
        allowed = declared(extras)
        for path in sorted((ROOT / area).rglob("*.py")):
            for module in sorted(imported_modules(path) - local):
                if module in sys.stdlib_module_names or module == "__future__":
                    continue
                # a module no installed distribution provides counts as its own name (bench's
                # matplotlib: bootstrap.sh installs the test extra, not the bench one)
                dists = {canonicalize_name(d) for d in providers.get(module, [module])}
                if not dists & allowed:
                    where = "dependencies" + "".join(f" or the {e} extra" for e in extras)
                    names = ", ".join(sorted(dists))
                    problems.append(
                        f"{path.relative_to(ROOT)}: {module} comes from {names}, "
                        f"which pyproject.toml's {where} does not name"
                    )
    return problems


def test_every_imported_distribution_is_declared_in_pyproject():
    assert undeclared_imports() == []


def test_the_check_sees_an_undeclared_import(tmp_path, monkeypatch):
    """A module imported only through another distribution's dependency is caught; the same
    import under ``except ImportError`` is not."""
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "strict.py").write_text("import pyeclib\nimport iniconfig\n")
    (tmp_path / "engine" / "soft.py").write_text(
        "try:\n    import pluggy\nexcept ImportError:\n    pluggy = None\n"
    )
    for folder in HELPER_FOLDERS:
        (tmp_path / folder).mkdir()
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "AREAS", {"engine": ()})
    problems = undeclared_imports()
    # iniconfig and pluggy come with pytest (the test extra), pyeclib is a dependency
    assert len(problems) == 1 and "engine/strict.py: iniconfig comes from iniconfig" in problems[0]
