"""The appliance's own Python environment: a venv outside every home folder (/opt/shingle).

systemd runs the units as the service user inside their sandbox (ProtectHome=yes hides
/home, /root and /run/user; PrivateTmp=yes gives them an empty /tmp), so neither the
checkout nor a Python under a home folder (pyenv, a user's venv) may be on the path they
execute. ``build`` makes a venv with a Python the units can reach and installs shingle and
its dependencies into it with pip, offline: every dependency comes from the running
environment, repacked into a wheel from its installed files (``repack``), and shingle
itself is built from the checkout. Nothing is fetched, so it works on a machine (or a VM)
without a package index; ``index=True`` lets pip fetch what the running environment lacks.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.metadata as metadata
import io
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path

from packaging.requirements import Requirement

DISTRIBUTION = "shingle-nas"
DEFAULT_VENV = Path("/opt/shingle")
# Debian's interpreter: the fallback when the running one lives where the units cannot look.
SYSTEM_PYTHON = Path("/usr/bin/python3")
# Folders a unit with ProtectHome=yes / PrivateTmp=yes does not see (as the host has them).
HIDDEN_BY_PROTECT_HOME = (Path("/home"), Path("/root"), Path("/run/user"))
HIDDEN_BY_PRIVATE_TMP = (Path("/tmp"), Path("/var/tmp"))
# The units an install wrote, kept in the venv so its own `shingle doctor` can compare.
UNITS_SHARE = Path("share/shingle/systemd")
# What the checkout's build needs (pyproject.toml's packages and metadata).
# setup.py compiles the hot paths (engine/native, appliance/nfs/onc) from their .pyx
BUILD_FILES = (
    "pyproject.toml",
    "setup.py",
    "README.md",
    "appliance",
    "engine",
    "webui",
    "migrations",
)

Progress = Callable[[str], None]


class VenvError(Exception):
    """A step of the build failed; the text names the command and its output."""


def hidden_from_units(path: Path) -> Path | None:
    """The sandboxed folder (/home, /root, /run/user, /tmp, /var/tmp) that holds ``path``."""
    for folder in HIDDEN_BY_PROTECT_HOME + HIDDEN_BY_PRIVATE_TMP:
        if path == folder or path.is_relative_to(folder):
            return folder
    return None


def _base_python() -> Path:
    """The interpreter behind the running one (a venv's own python is a link to it)."""
    return Path(os.path.realpath(getattr(sys, "_base_executable", sys.executable)))


def choose_python(wanted: str | None = None) -> Path:
    """An interpreter of this Python version that the units can execute: ``wanted``, else
    the running one's base, else /usr/bin/python3 (wheels of this environment are built
    for this major.minor)."""
    candidates = [Path(wanted)] if wanted else [_base_python(), SYSTEM_PYTHON]
    ours = f"{sys.version_info.major}.{sys.version_info.minor}"
    tried = []
    for candidate in candidates:
        real = Path(os.path.realpath(candidate))
        hidden = hidden_from_units(real)
        if hidden is not None:
            tried.append(f"{candidate} (under {hidden}, hidden from the units)")
            continue
        if not os.access(real, os.X_OK):
            tried.append(f"{candidate} (not executable)")
            continue
        version = subprocess.run(
            [str(real), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout.strip()
        if version != ours:
            tried.append(f"{candidate} (Python {version or '?'}, need {ours})")
            continue
        return Path(candidate)
    raise VenvError(
        f"no Python {ours} that the units may execute: tried {'; '.join(tried)}; "
        f"install python{ours} outside /home and /root, or pass --python PATH"
    )


# -- wheels from the running environment ----------------------------------------------------
def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def dependency_closure(distribution: str = DISTRIBUTION) -> list[metadata.Distribution]:
    """The installed distributions ``distribution`` needs, recursively (markers and extras
    evaluated for this interpreter); itself is not among them."""
    found: dict[str, metadata.Distribution] = {}

    def requirements(dist: metadata.Distribution, extras: Iterable[str]) -> list[Requirement]:
        wanted = []
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or any(
                req.marker.evaluate({"extra": extra}) for extra in ("", *extras)
            ):
                wanted.append(req)
        return wanted

    def visit(req: Requirement) -> None:
        key = _canonical(req.name)
        if key in found:
            return
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            raise VenvError(
                f"{req.name} (needed by {distribution}) is not installed in {sys.prefix}: "
                "install it there first, or let pip fetch it (--index)"
            ) from None
        found[key] = dist
        for sub in requirements(dist, req.extras):
            visit(sub)

    for req in _top_requirements(distribution, requirements):
        visit(req)
    return list(found.values())


def _top_requirements(distribution: str, requirements) -> list[Requirement]:
    """What the wheel built from the checkout will require: its pyproject.toml's dependencies
    (an environment installed from an older checkout has older metadata, and pip would then
    miss a dependency added since), else the installed distribution's."""
    import tomllib

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    if distribution == DISTRIBUTION and pyproject.is_file():
        listed = tomllib.loads(pyproject.read_text())["project"].get("dependencies", [])
        return [
            req
            for req in map(Requirement, listed)
            if req.marker is None or req.marker.evaluate({"extra": ""})
        ]
    return requirements(metadata.distribution(distribution), ())


def _wheel_tags(wheel_text: str) -> str:
    """The compressed tag set of a WHEEL file's Tag lines (cp311-cp311-manylinux_...)."""
    pythons: list[str] = []
    abis: list[str] = []
    platforms: list[str] = []
    for line in wheel_text.splitlines():
        if line.startswith("Tag:"):
            python, abi, platform = line.split(":", 1)[1].strip().split("-")
            for part, seen in ((python, pythons), (abi, abis), (platform, platforms)):
                if part not in seen:
                    seen.append(part)
    if not pythons:
        return "py3-none-any"
    return "-".join(".".join(parts) for parts in (pythons, abis, platforms))


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def repack(dist: metadata.Distribution, dest: Path) -> Path:
    """A wheel of an installed distribution, from the files its RECORD lists inside
    site-packages (scripts are left out: pip writes them again from entry_points.txt;
    byte code is left out: pip compiles for the new interpreter)."""
    site = Path(str(dist.locate_file("")))
    info = next(
        (Path(str(f)).parts[0] for f in dist.files or [] if str(f).endswith(".dist-info/RECORD")),
        None,
    )
    if info is None:
        raise VenvError(f"{dist.metadata['Name']}: no RECORD in its dist-info, cannot repack")
    wheel_text = (site / info / "WHEEL").read_text()
    name = dist.metadata["Name"].replace("-", "_").replace(".", "_")
    path = dest / f"{name}-{dist.version}-{_wheel_tags(wheel_text)}.whl"
    rows = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as wheel:
        for entry in dist.files or []:
            rel = Path(str(entry))
            if rel.parts[0] == ".." or "__pycache__" in rel.parts or rel.suffix == ".pyc":
                continue
            if rel.parts[0] == info and rel.name in ("RECORD", "INSTALLER", "direct_url.json"):
                continue
            source = site / rel
            if not source.is_file():
                continue
            data = source.read_bytes()
            zinfo = zipfile.ZipInfo(rel.as_posix(), date_time=(1980, 1, 1, 0, 0, 0))
            zinfo.external_attr = (source.stat().st_mode & 0o777 | 0o100000) << 16
            wheel.writestr(zinfo, data)
            rows.append((rel.as_posix(), _record_hash(data), str(len(data))))
        record = io.StringIO()
        writer = csv.writer(record, lineterminator="\n")
        writer.writerows([*rows, (f"{info}/RECORD", "", "")])
        wheel.writestr(f"{info}/RECORD", record.getvalue())
    return path


def build_checkout_wheel(checkout: Path, dest: Path, run=subprocess.run) -> Path:
    """shingle's own wheel, built by the running environment's setuptools from a copy of the
    checkout (the build leaves build/ and *.egg-info behind: not in the checkout)."""
    with tempfile.TemporaryDirectory(prefix="shingle-build-") as tmp:
        source = Path(tmp) / "src"
        source.mkdir()
        for name in BUILD_FILES:
            origin = checkout / name
            if origin.is_dir():
                # compiled here from the .pyx, never a .so left in the checkout
                shutil.copytree(
                    origin,
                    source / name,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.c"),
                )
            elif origin.is_file():
                shutil.copy2(origin, source / name)
        _pip(
            run,
            sys.executable,
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--wheel-dir",
            str(dest),
            str(source),
        )
    (wheel,) = dest.glob(f"{DISTRIBUTION.replace('-', '_')}-*.whl")
    return wheel


def compiled(wheel: Path) -> bool:
    """Whether ``wheel`` carries the compiled extensions (setup.py builds them optionally)."""
    with zipfile.ZipFile(wheel) as archive:
        return any(name.endswith(".so") for name in archive.namelist())


def _pip(run, python: str, *args: str) -> str:
    cmd = [python, "-m", "pip", "--disable-pip-version-check", "--no-input", *args]
    result = run(cmd, capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        raise VenvError(
            f"{' '.join(cmd)} failed (exit {result.returncode}): "
            f"{(result.stderr or result.stdout).strip()[-2000:]}"
        )
    return result.stdout


# -- the venv ---------------------------------------------------------------------------
def build(
    venv: Path,
    checkout: Path,
    *,
    python: str | None = None,
    index: bool = False,
    progress: Progress = lambda text: None,
    run=subprocess.run,
) -> bool:
    """Create or refresh the venv at ``venv`` with shingle from ``checkout``; False when it
    held this checkout's shingle and every dependency already (nothing changed). An existing
    venv keeps what still fits and gets this checkout's shingle (an upgrade)."""
    interpreter = choose_python(python)
    old_umask = os.umask(0o022)  # the service user reads and executes all of it
    try:
        if not (venv / "bin" / "python").exists():
            progress(f"creating venv {venv} with {interpreter}")
            venv.parent.mkdir(parents=True, exist_ok=True)
            result = run(
                [str(interpreter), "-m", "venv", str(venv)],
                capture_output=True,
                text=True,
                timeout=600,
            )
            if result.returncode != 0:
                raise VenvError(
                    f"{interpreter} -m venv {venv} failed (exit {result.returncode}): "
                    f"{result.stderr.strip()} (Debian: apt-get install python3-venv)"
                )
        else:
            progress(f"refreshing venv {venv}")
        if not index and not missing_dependencies(venv) and current(venv, checkout):
            progress(f"venv {venv} holds this checkout's shingle and every dependency already")
            return False
        with tempfile.TemporaryDirectory(prefix="shingle-wheels-") as tmp:
            wheels = Path(tmp)
            present = installed_in(venv)
            dists = [] if index else missing_dependencies(venv)
            for i, dist in enumerate(dists, 1):
                progress(f"wheel {i}/{len(dists)}: {dist.metadata['Name']} {dist.version}")
                repack(dist, wheels)
            progress(f"building {DISTRIBUTION} from {checkout}")
            wheel = build_checkout_wheel(checkout, wheels, run)
            if not compiled(wheel):
                progress(
                    f"warning: {wheel.name} has no compiled hot paths (no Cython or no C "
                    "compiler where it was built): the appliance runs their slower Python "
                    "fallbacks; scripts/bootstrap.sh installs both"
                )
            source = ["--find-links", str(wheels)] + ([] if index else ["--no-index"])
            if dists or index or not present:
                progress(f"pip install into {venv} ({len(dists) + 1} wheels)")
                _pip(run, str(venv / "bin" / "python"), "install", *source, str(wheel))
            else:
                progress(f"pip install into {venv}: every dependency is there already")
            # the checkout's code always replaces the venv's: same version number, new code
            _pip(
                run,
                str(venv / "bin" / "python"),
                "install",
                "--no-deps",
                "--force-reinstall",
                *source,
                str(wheel),
            )
    finally:
        os.umask(old_umask)
    launcher = venv / "bin" / "shingle"
    if not launcher.is_file():
        raise VenvError(f"pip installed {DISTRIBUTION} but {launcher} is missing")
    progress(f"venv ready: {launcher}")
    return True


def missing_dependencies(venv: Path) -> list[metadata.Distribution]:
    """The distributions of shingle's closure that the venv lacks at this environment's
    version."""
    present = installed_in(venv)
    return [
        d for d in dependency_closure() if present.get(_canonical(d.metadata["Name"])) != d.version
    ]


def current(venv: Path, checkout: Path) -> bool:
    """Whether the venv's shingle is this checkout's: every file its RECORD lists from the
    checkout's packages has the same bytes, and no source file of theirs is new."""
    records = list(venv.glob(f"lib/python*/site-packages/{_wheel_name()}-*.dist-info/RECORD"))
    if len(records) != 1:
        return False
    packages = [name for name in BUILD_FILES if (checkout / name).is_dir()]
    listed = {}
    for row in csv.reader(records[0].read_text().splitlines()):
        if len(row) >= 2 and row[1] and row[0].split("/", 1)[0] in packages:
            listed[row[0]] = row[1]
    for rel, digest in listed.items():
        source = checkout / rel
        if not source.is_file() or _record_hash(source.read_bytes()) != digest:
            return False
    for package in packages:
        for source in (checkout / package).rglob("*.py"):
            if "__pycache__" not in source.parts:
                if source.relative_to(checkout).as_posix() not in listed:
                    return False
    return bool(listed)


def _wheel_name() -> str:
    return DISTRIBUTION.replace("-", "_")


def installed_in(venv: Path) -> dict[str, str]:
    """{canonical name: version} of the distributions in a venv's site-packages."""
    found = {}
    for info in venv.glob("lib/python*/site-packages/*.dist-info"):
        name, _, version = info.name.removesuffix(".dist-info").rpartition("-")
        if name:
            found[_canonical(name)] = version
    return found


def keep_units(venv: Path, sources: dict[str, Path]) -> None:
    """The shipped units in the venv, for its own `shingle doctor` and `shingle install`
    (a venv has no checkout beside it)."""
    share = venv / UNITS_SHARE
    share.mkdir(parents=True, exist_ok=True)
    for name, source in sources.items():
        if source.resolve() != (share / name).resolve():
            shutil.copyfile(source, share / name)
        (share / name).chmod(0o644)


def relocate(built: Path, target: Path) -> None:
    """A venv built at ``built`` (inside a staging root) made to run from ``target``: its
    scripts' #! lines and activate files name the folder it was built in."""
    old, new = str(built).encode(), str(target).encode()
    for script in (built / "bin").iterdir():
        if script.is_symlink() or not script.is_file():
            continue
        data = script.read_bytes()
        if old in data:
            mode = script.stat().st_mode
            script.write_bytes(data.replace(old, new))
            script.chmod(mode)
