"""The `shingle` command line (entry point ``appliance.cli:main``).

parser.py builds the parser from the command modules beside it (one per group of commands,
each with ``register(subparsers)``) and runs the chosen ``cmd_NAME(args)``; common.py holds
what they share. Errors a user can fix (bad config, bad arguments, catalog out of date) print
one line and exit 2; no traceback."""

from appliance.cli.parser import build_parser, main

__all__ = ["build_parser", "main"]
