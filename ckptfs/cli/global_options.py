"""The options every command takes before or after its name: ``--debug`` and ``--limit NAME=VALUE``."""

from __future__ import annotations

import argparse

from ckptfs.limits import Limits, parse_quantity


def _parse_limit(text: str) -> tuple[str, int]:
    name, sep, value = text.partition("=")
    if not sep or name not in Limits.names():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE with NAME one of {', '.join(Limits.names())}")
    try:
        return name, parse_quantity(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{name}: {exc}") from None


def add_limit_option(parser: argparse.ArgumentParser, dest: str) -> None:
    """``--limit`` before or after the command (two destinations: a command's namespace replaces the top one's)."""
    parser.add_argument("--limit", action="append", type=_parse_limit, default=[], dest=dest, metavar="NAME=VALUE",
                        help="raise a safety limit (repeatable; ckptfs --help-limits lists them), e.g. "
                             "--limit max_pickle_bytes=1GiB")


def add_debug_option(parser: argparse.ArgumentParser) -> None:
    """``--debug`` after the command too; given nowhere, the top parser's False stands."""
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the traceback of an error")


def add_global_options(parser: argparse.ArgumentParser) -> None:
    """What a command takes after its name of the options before it."""
    add_limit_option(parser, "command_limit")
    add_debug_option(parser)
