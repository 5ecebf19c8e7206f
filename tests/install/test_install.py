"""`shingle install --root` lays out the tree, is idempotent, upgrades in
place; uninstall keeps data."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest

from appliance import config as config_mod
from appliance.host import install
from engine.admin import accounts
from engine.catalog import Catalog
from engine.catalog.migrate import current_revision, downgrade, head_revision
from tests.install.conftest import LAUNCHER, shingle, verify

EXPECTED_FILES = {
    "etc/shingle/shingle.toml",
    "etc/sysusers.d/shingle.conf",
    "etc/tmpfiles.d/shingle.conf",
    "etc/systemd/system/shingle-nfsd.service",
    "etc/systemd/system/shingle-webui.service",
    "etc/systemd/system/shingle-smbd.service",
    "etc/systemd/system/shingle.target",
    "var/lib/shingle/catalog.db",
    "var/lib/shingle/initial-admin-password",
    "var/lib/shingle/webui-secret.key",
    "var/lib/shingle/shingle.lock",  # the daemon lock, held while the catalog was migrated
    LAUNCHER.lstrip("/"),
}


def tree(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under root: content and mtime (the catalog by revision, since
    SQLite rewrites its header)."""
    files = {}
    for path in root.rglob("*"):
        if path.is_file() and not path.name.endswith(("-wal", "-shm")):
            rel = str(path.relative_to(root))
            files[rel] = (
                b"" if rel.endswith(".db") else path.read_bytes(),
                path.stat().st_mtime_ns,
            )
    return files


def catalog_url(root: Path) -> str:
    return f"sqlite:///{root}/var/lib/shingle/catalog.db"


def test_install_lays_out_the_tree(root):
    out = shingle("install", "--root", str(root), "--bin", LAUNCHER).stdout
    assert set(tree(root)) == EXPECTED_FILES
    assert (root / "var/lib/shingle/drives").is_dir()
    # The config is the documented sample with data_dir set, and it loads.
    text = (root / "etc/shingle/shingle.toml").read_text()
    sample = config_mod.render({"appliance.data_dir": "/var/lib/shingle"}, commented_defaults=True)
    assert text == sample
    assert "# " + config_mod.OPTIONS[1].doc in text
    assert tomllib.loads(text)["appliance"]["data_dir"] == "/var/lib/shingle"
    assert oct((root / "etc/shingle/shingle.toml").stat().st_mode & 0o777) == "0o640"
    assert oct((root / "var/lib/shingle/webui-secret.key").stat().st_mode & 0o777) == "0o600"
    assert current_revision(catalog_url(root)) == head_revision()
    # The first admin can log in with the password the installer wrote down.
    user, password = (root / "var/lib/shingle/initial-admin-password").read_text().split()
    catalog = Catalog(catalog_url(root))
    try:
        assert accounts.verify_login(catalog, user, password) is not None
        # the export root is like /tmp, as `shingle init` makes it: a squashed root writes
        from engine.namespace import Namespace

        ns = Namespace(catalog)
        root_attr = ns.getattr(ns.root_ino)
        # owned by the default export's anonymous user (engine.admin.exports.prepare_new_root)
        assert (root_attr.mode & 0o7777, root_attr.uid, root_attr.gid) == (0o1777, 65534, 65534)
    finally:
        catalog.close()
    # --root leaves the host's users and systemd alone, and says what the target must still do.
    assert "systemd-sysusers" in out and f"systemctl --root={root} enable shingle.target" in out
    assert "next steps:" in out and "doctor" in out
    assert (root / "etc/sysusers.d/shingle.conf").read_text().startswith("u shingle ")


def test_install_with_root_runs_no_host_command(root, tmp_path):
    calls = []
    report = install.install(root, launcher=LAUNCHER, run=lambda *a, **kw: calls.append(a))
    assert calls == []  # no useradd, no systemctl: the host is not touched
    assert not Path("/etc/systemd/system/shingle-nfsd.service").exists()
    assert any("create the system user" in p for p in report.pending)


def test_install_twice_is_idempotent(root):
    install.install(root, launcher=LAUNCHER)
    before = tree(root)
    out = shingle("install", "--root", str(root), "--bin", LAUNCHER).stdout
    assert tree(root) == before  # not one file rewritten
    report = out[out.index("installed shingle (root") :].split("left for the target host:")[0]
    actions = [line.strip() for line in report.splitlines()[1:]]
    assert actions and all(a.startswith(("unchanged", "kept")) for a in actions), actions
    for unit in install.UNIT_NAMES:
        result = verify(root, unit)
        assert (result.returncode, result.stderr) == (0, ""), unit


def test_upgrade_migrates_the_catalog_and_keeps_config_and_data(root):
    install.install(root, launcher=LAUNCHER)
    config = root / "etc/shingle/shingle.toml"
    edited = (
        config.read_text()
        .replace('# level = "info"', 'level = "debug"')
        .replace("# port = 2049", "port = 20490")
    )
    config.write_text(edited)
    (root / "var/lib/shingle/drives/zone-marker").write_bytes(b"user data")
    password_file = (root / "var/lib/shingle/initial-admin-password").read_text()
    url = catalog_url(root)
    downgrade(url, "-1")  # an install of the previous release
    old = current_revision(url)
    assert old != head_revision()

    out = shingle("install", "--root", str(root), "--bin", LAUNCHER).stdout
    assert f"upgraded (from revision {old}) catalog" in out
    assert current_revision(url) == head_revision()
    assert config.read_text() == edited  # never overwritten
    assert config_mod.load(config).get("nfs.port") == 20490
    assert (root / "var/lib/shingle/drives/zone-marker").read_bytes() == b"user data"
    assert (root / "var/lib/shingle/initial-admin-password").read_text() == password_file
    if old is not None:  # rows of the older schema survive the upgrade
        catalog = Catalog(url)
        try:
            user, password = password_file.split()
            assert accounts.verify_login(catalog, user, password) is not None
        finally:
            catalog.close()


def test_broken_config_stops_the_upgrade_before_anything_changes(root):
    config = root / "etc/shingle/shingle.toml"
    config.parent.mkdir(parents=True)
    config.write_text("[nfs]\nport = 70000\n")
    result = shingle("install", "--root", str(root), "--bin", LAUNCHER, check=False)
    assert result.returncode == 2
    assert "nfs.port" in result.stderr and "70000" in result.stderr and "0-65535" in result.stderr
    assert "Traceback" not in result.stderr
    assert config.read_text() == "[nfs]\nport = 70000\n"
    assert not (root / "etc/systemd/system").exists()
    assert not (root / "var/lib/shingle/catalog.db").exists()


def test_relative_launcher_is_refused(root):
    result = shingle("install", "--root", str(root), "--bin", "shingle", check=False)
    assert result.returncode == 2 and "absolute path" in result.stderr


def test_uninstall_keeps_data_and_purge_removes_it(root):
    install.install(root, launcher=LAUNCHER)
    (root / "var/lib/shingle/drives/zone-marker").write_bytes(b"user data")
    first = shingle("uninstall", "--root", str(root)).stdout
    assert first.count("removed unit") == len(install.UNIT_NAMES)
    assert not list((root / "etc/systemd/system").iterdir())
    assert (root / "etc/shingle/shingle.toml").is_file()
    assert (root / "var/lib/shingle/drives/zone-marker").read_bytes() == b"user data"
    assert current_revision(catalog_url(root)) == head_revision()
    again = install.uninstall(root)  # idempotent
    assert again.actions == ["nothing to remove: no shingle units installed"]
    assert (root / "var/lib/shingle/catalog.db").is_file()

    # Reinstall over kept data, then purge.
    install.install(root, launcher=LAUNCHER)
    assert (root / "var/lib/shingle/drives/zone-marker").is_file()
    purged = shingle("uninstall", "--root", str(root), "--purge").stdout
    assert "purged" in purged
    left = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}
    assert left == {LAUNCHER.lstrip("/")}
    assert install.uninstall(root, purge=True).actions == [
        "nothing to remove: shingle is not installed"
    ]
    assert not os.path.exists(root / "var/lib/shingle")


def test_host_install_refuses_a_non_root_user_before_touching_anything(monkeypatch):
    """Running as an ordinary user is not possible in this root-only sandbox: the uid is faked."""
    import pytest

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    calls = []
    for action in (
        lambda: install.install(None, launcher=LAUNCHER, run=calls.append),
        lambda: install.uninstall(None, purge=True, run=calls.append),
    ):
        with pytest.raises(install.InstallError, match="needs root .* --root DIR"):
            action()
    assert calls == []


def test_upgrade_waits_for_a_running_daemon(root):
    """While a daemon holds the drives (its lock), the schema is not changed under it."""
    import subprocess
    import sys

    from tests.install.conftest import REPO

    install.install(root, launcher=LAUNCHER)
    url = catalog_url(root)
    downgrade(url, "-1")
    old = current_revision(url)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"""
import sys, time
from appliance.daemonlock import DaemonLock
lock = DaemonLock({str(root / "var/lib/shingle")!r})
assert lock.acquire()
print("held", flush=True)
time.sleep(60)
""",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        result = shingle("install", "--root", str(root), "--bin", LAUNCHER, check=False)
        assert result.returncode == 1
        assert f"a shingle daemon (pid {holder.pid}) serves" in result.stderr
        assert current_revision(url) == old  # untouched
    finally:
        holder.kill()
        holder.wait()
    shingle("install", "--root", str(root), "--bin", LAUNCHER)
    assert current_revision(url) == head_revision()


def test_a_launcher_under_home_is_refused(root):
    """Units whose ExecStart= the sandbox hides would fail with 203/EXEC: install refuses
    to write them."""
    unit = root / "etc/systemd/system/shingle-nfsd.service"
    with pytest.raises(install.InstallError, match="/home/alice/venv/bin/shingle is under /home"):
        install.install(root, launcher="/home/alice/venv/bin/shingle")
    assert not unit.exists()
    install.install(root, launcher=LAUNCHER)
    # A venv launcher outside /home whose Python lives in /root (pyenv) is hidden just the same.
    (root / LAUNCHER.lstrip("/")).write_text(
        "#!/root/.pyenv/versions/3.11.7/bin/python3.11\nimport sys\n"
    )
    with pytest.raises(install.InstallError, match="python3.11 is under /root"):
        install.install(root, launcher=LAUNCHER)
    # and so is one in /tmp (PrivateTmp=yes)
    result = shingle("install", "--root", str(root), "--bin", "/tmp/x/bin/shingle", check=False)
    assert result.returncode == 1 and "/tmp/x/bin/shingle is under /tmp" in result.stderr


def test_install_on_a_postgresql_catalog(root, postgres_server):
    """A config the admin wrote first (PostgreSQL catalog) is kept; that database is
    migrated and never dropped."""
    url = postgres_server.create_database()
    config = root / "etc/shingle/shingle.toml"
    config.parent.mkdir(parents=True)
    config.write_text(
        config_mod.render(
            {"appliance.data_dir": "/var/lib/shingle", "catalog.url": url}, commented_defaults=True
        )
    )
    text = config.read_text()
    out = shingle("install", "--root", str(root), "--bin", LAUNCHER).stdout
    assert "kept config" in out and f"created catalog: {url} at revision {head_revision()}" in out
    assert config.read_text() == text
    assert current_revision(url) == head_revision()
    assert not (root / "var/lib/shingle/catalog.db").exists()
    doctor = shingle("doctor", "--root", str(root), "--json", check=False)
    catalog = [c for c in __import__("json").loads(doctor.stdout) if c["name"] == "catalog"][0]
    assert catalog["status"] == "ok" and url in catalog["detail"]
    report = install.uninstall(root, purge=True)
    assert any(f"kept the catalog database {url}" in p for p in report.pending)
    assert current_revision(url) == head_revision()  # purge leaves a shared database alone
