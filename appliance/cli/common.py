"""What every command module shares: finding and loading the config, the one-line usage error,
size arguments, exit codes."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from appliance import config as config_mod
from engine.base import errors

DEFAULT_CONFIG = "/etc/shingle/shingle.toml"
LOCAL_CONFIG = "var/appliance/shingle.toml"  # what ./run-appliance makes, relative to the checkout
EXIT_USAGE = 2
EXIT_JOB_ABANDONED = 3  # the daemon running the job we waited for stopped


class Unreachable(Exception):
    """An agent or etcd that does not answer: one line on stderr, exit code 1."""


class UsageError(Exception):
    """A mistake the user can fix: printed as one line, exit code 2."""


def size_arg(text: str) -> int:
    try:
        return config_mod.parse_size(text, "size")
    except errors.ConfigError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: expected {exc.expected}") from None


def find_config(explicit: str | None) -> Path:
    """The config file: -c, then $SHINGLE_CONFIG, then ./var/appliance (./run-appliance's), then
    /etc/shingle (an installed appliance). A path given by -c or the variable is used as it is, so a
    typo there is reported instead of silently falling through to another appliance."""
    if explicit:
        return Path(explicit)
    if os.environ.get("SHINGLE_CONFIG"):
        return Path(os.environ["SHINGLE_CONFIG"])
    tried = [Path(LOCAL_CONFIG), Path(DEFAULT_CONFIG)]
    for path in tried:
        if path.is_file():
            return path.resolve()  # children (the web UI, gunicorn) may start in another folder
    raise UsageError(
        "no config file found: tried -c (not given), $SHINGLE_CONFIG (not set), "
        f"./{LOCAL_CONFIG} and {DEFAULT_CONFIG}; pass -c DIR/shingle.toml or "
        "export SHINGLE_CONFIG=DIR/shingle.toml (`shingle init DIR` makes one)"
    )


def load_config(args) -> config_mod.Config:
    return config_mod.load(find_config(args.config))
