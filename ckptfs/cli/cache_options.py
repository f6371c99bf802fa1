"""The options of commands that cache on disk: --cache-dir, --no-cache."""

from __future__ import annotations

import argparse
from pathlib import Path

from ckptfs.cache_dir import default_cache_dir


def add_cache_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("caching on disk")
    group.add_argument("--cache-dir", metavar="DIR", type=Path,
                       help="where to cache parsed metadata (repeat opens of an unchanged checkpoint) and remote "
                            "blocks (default: $XDG_CACHE_HOME/ckptfs, else ~/.cache/ckptfs)")
    group.add_argument("--no-cache", action="store_true", help="neither read nor write the cache on disk")


def cache_dir(args: argparse.Namespace) -> Path | None:
    """The cache folder the command uses, or None with --no-cache."""
    if args.no_cache:
        return None
    return args.cache_dir if args.cache_dir is not None else default_cache_dir()
