"""The config file: validated at load, one clear line and exit code 2 when wrong."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest

from appliance import config
from engine.base.errors import ConfigError


def write(tmp_path, text):
    path = tmp_path / "shingle.toml"
    path.write_text(text)
    return path


def test_shipped_sample_is_the_rendered_documentation():
    assert config.SAMPLE_PATH.read_text().strip() == config.render().strip()
    parsed = config.from_dict(tomllib.loads(config.SAMPLE_PATH.read_text()))
    for option in config.OPTIONS:  # every option is documented and parses to its default
        assert f"# {option.doc}" in config.SAMPLE_PATH.read_text()
        assert parsed.get(option.key) == config._check(option, option.default)


def test_defaults_and_relative_paths(tmp_path):
    cfg = config.load(write(tmp_path, "[nfs]\nport = 20490\n"))
    assert cfg.get("nfs.port") == 20490
    assert cfg.get("nfs.max_record_size") == 5 << 20
    assert cfg.catalog_url == f"sqlite:///{tmp_path}/catalog.db"
    assert cfg.resolve("storage.drives_dir") == tmp_path / "drives"
    assert set(cfg.policies()) == {"hot", "warm", "cold"}


@pytest.mark.parametrize(
    "text,key,fragment",
    [
        ("[nfs]\nport = 70000\n", "nfs.port", "0-65535"),
        ('[nfs]\nport = "x"\n', "nfs.port", "whole number"),
        ("[nfs]\nprot = 1\n", "nfs.prot", "known option"),
        ("[nsf]\nport = 1\n", "nsf", "known section"),
        ('[logging]\nlevel = "loud"\n', "logging.level", "debug, info"),
        ('[nfs]\nmax_record_size = "12 parsecs"\n', "nfs.max_record_size", "size"),
        ("[storage]\nreserve_zones = 0\n", "storage.reserve_zones", "at least 1"),
        ("[storage]\ninline_write_bytes = 4194304\n", "storage.inline_write_bytes", ""),
        ("[storage]\ninline_budget_bytes = -1\n", "storage.inline_budget_bytes", ""),
        ("[band_classes.warm]\nk = 0\n", "band_classes.warm.k", ""),
        ('[band_classes.warm]\nbackend = "no_such_backend"\n', "band_classes.warm.backend", ""),
        ("[band_classes.lukewarm]\nk = 4\n", "band_classes.lukewarm", "hot, warm, cold"),
        ("not toml = = =\n", "config file", "valid TOML"),
        ('[nfs]\nhost = "0.0.0.0"\n[pnfs]\nrole = "ds"\n', "pnfs.address", "HOST:PORT"),
        # an IPv6 data server goes in brackets, or its port could not be told from it
        ('[pnfs]\nrole = "mds"\ndata_servers = "fd00::5:2049"\n', "pnfs.data_servers", "[IPV6]"),
    ],
)
def test_bad_values_name_key_value_and_expectation(tmp_path, text, key, fragment):
    with pytest.raises(ConfigError) as exc:
        config.load(write(tmp_path, text))
    assert exc.value.key == key
    assert fragment in exc.value.expected


def test_data_servers_may_be_ipv6_in_brackets():
    servers = config.data_server_addresses("10.0.0.11:2049, [fd00::5]:2050")
    assert servers == [("10.0.0.11", 2049), ("fd00::5", 2050)]


def test_sizes():
    assert config.parse_size("4GiB") == 4 << 30
    assert config.parse_size("16MiB") == 16 << 20
    assert config.parse_size(4096) == 4096
    with pytest.raises(ConfigError):
        config.parse_size("-1MiB")


def test_cli_reports_bad_config_in_one_line_with_exit_2(tmp_path):
    path = write(tmp_path, "[nfs]\nport = 70000\n")
    run = subprocess.run(
        [sys.executable, "-m", "appliance.cli", "-c", str(path), "config", "check"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2
    assert run.stdout == ""
    lines = run.stderr.strip().splitlines()
    assert (
        len(lines) == 1
        and "nfs.port" in lines[0]
        and "70000" in lines[0]
        and "Traceback" not in run.stderr
    )
    missing = subprocess.run(
        [sys.executable, "-m", "appliance.cli", "-c", str(tmp_path / "nope.toml"), "status"],
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 2 and "shingle init" in missing.stderr
