"""The parser of every `shingle` command, and ``main``, which runs the chosen one.

Each command module registers its subcommands (``register(subparsers)``), each a function
``cmd_NAME(args)``; the modules are listed here in the order `shingle --help` shows them."""

from __future__ import annotations

import argparse
import os
import sys

from appliance.cli import (
    agent,
    alerts,
    cluster,
    exports,
    init,
    install,
    lifecycle,
    quota,
    serve,
    smb,
    snapshot,
    status,
    tools,
    webui,
)
from appliance.cli.common import (
    DEFAULT_CONFIG,
    EXIT_JOB_ABANDONED,
    EXIT_USAGE,
    LOCAL_CONFIG,
    UsageError,
)
from engine.base import errors
from engine.base.version import python_version, version

COMMAND_MODULES = (
    init,
    status,
    tools,
    serve,
    alerts,
    exports,
    install,
    lifecycle,
    quota,
    smb,
    snapshot,
    webui,
    agent,
    cluster,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shingle", description="NAS appliance for AI training data on SMR drives"
    )
    parser.add_argument(
        "-c",
        "--config",
        help="config file (default: $SHINGLE_CONFIG, else "
        f"./{LOCAL_CONFIG}, else {DEFAULT_CONFIG})",
    )
    parser.add_argument(
        "--version", action="version", version=f"shingle {version()} (Python {python_version()})"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)  # inside: `shingle --help | head -1` closes the pipe too
        code = args.func(args) or 0
        sys.stdout.flush()  # a reader that left shows here, not in the interpreter's exit
        return code
    except BrokenPipeError:
        # `shingle status | head`: the reader left, which is not an error of this command. Point
        # stdout at /dev/null so the interpreter's final flush does not fail a second time.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # as a shell reports a process ended by SIGPIPE (128 + 13)
    except (errors.ConfigError, UsageError) as exc:
        print(f"shingle: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except errors.FsError as exc:
        print(f"shingle: {exc.strerror}", file=sys.stderr)
        return 1
    except errors.JobAbandoned as exc:
        print(f"shingle: {exc}", file=sys.stderr)
        return EXIT_JOB_ABANDONED
    except KeyboardInterrupt:
        return 130
