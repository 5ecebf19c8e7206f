"""appliance/host/venv.py without building a whole venv (tests/install/test_host_install.py builds
the real one): wheels repacked from installed files, and when a venv is current."""

from __future__ import annotations

import importlib.metadata as metadata
import subprocess
import sys
import zipfile
from pathlib import Path

from appliance.host import venv


def test_wheel_tags_compress_the_tag_lines():
    assert venv._wheel_tags("Wheel-Version: 1.0\nTag: py3-none-any\n") == "py3-none-any"
    text = "Tag: cp311-cp311-manylinux_2_17_x86_64\nTag: cp311-cp311-manylinux2014_x86_64\n"
    assert venv._wheel_tags(text) == "cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64"


def test_an_installed_distribution_repacks_into_a_wheel_pip_installs(tmp_path):
    dist = metadata.distribution("itsdangerous")  # small, pure Python, a dependency of Flask
    wheel = venv.repack(dist, tmp_path)
    assert wheel.name == f"itsdangerous-{dist.version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        record = archive.read(f"itsdangerous-{dist.version}.dist-info/RECORD").decode()
    assert "itsdangerous/__init__.py" in names
    assert not any(n.endswith(".pyc") or n.startswith("..") for n in names)
    assert "itsdangerous/__init__.py,sha256=" in record
    target = tmp_path / "target"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-index",
            "--no-deps",
            "--target",
            str(target),
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    original = Path(str(dist.locate_file("itsdangerous/signer.py"))).read_bytes()
    assert (target / "itsdangerous/signer.py").read_bytes() == original


def test_the_closure_holds_shingles_dependencies_and_their_extras():
    names = {venv._canonical(d.metadata["Name"]) for d in venv.dependency_closure()}
    assert {"sqlalchemy", "flask", "werkzeug", "gunicorn", "pyeclib"} <= names
    assert "psycopg-binary" in names  # psycopg[binary]: the extra's requirement is followed
    assert "pytest" not in names and "shingle-nas" not in names


def test_the_closure_follows_the_checkouts_pyproject_not_older_installed_metadata():
    """The wheel built from the checkout requires what pyproject.toml lists; a dependency added
    since this environment installed shingle must be repacked too, or pip finds none."""
    import tomllib

    from packaging.requirements import Requirement

    listed = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    wanted = {venv._canonical(Requirement(r).name) for r in listed["project"]["dependencies"]}
    names = {venv._canonical(d.metadata["Name"]) for d in venv.dependency_closure()}
    assert wanted and wanted <= names


def test_a_venv_is_current_until_a_checkout_file_changes(tmp_path):
    checkout = tmp_path / "checkout"
    (checkout / "appliance").mkdir(parents=True)
    (checkout / "appliance" / "cli.py").write_text("print('v1')\n")
    site = tmp_path / "venv/lib/python3.11/site-packages"
    info = site / "shingle_nas-0.1.0.dist-info"
    info.mkdir(parents=True)
    digest = venv._record_hash(b"print('v1')\n")
    info.joinpath("RECORD").write_text(
        f"appliance/cli.py,{digest},12\nshingle_nas-0.1.0.dist-info/RECORD,,\n"
    )
    assert venv.current(tmp_path / "venv", checkout)
    (checkout / "appliance" / "new.py").write_text("")
    assert not venv.current(tmp_path / "venv", checkout)  # a module the venv lacks
    (checkout / "appliance" / "new.py").unlink()
    (checkout / "appliance" / "cli.py").write_text("print('v2')\n")
    assert not venv.current(tmp_path / "venv", checkout)


def test_a_python_the_units_cannot_see_is_not_chosen(tmp_path):
    assert venv.hidden_from_units(Path("/root/.pyenv/versions/3.11.7/bin/python3.11"))
    assert venv.hidden_from_units(Path("/tmp/x/bin/python")) == Path("/tmp")
    assert venv.hidden_from_units(Path("/usr/bin/python3")) is None
    try:
        venv.choose_python("/root/.pyenv/versions/3.11.7/bin/python3.11")
    except venv.VenvError as exc:
        assert "hidden from the units" in str(exc)
    else:
        raise AssertionError("a Python under /root was chosen")
    chosen = venv.choose_python()
    assert venv.hidden_from_units(Path(chosen).resolve()) is None
