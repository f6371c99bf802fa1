"""The options of commands that cache on disk: --cache-dir, --no-cache (``-o cache_dir=DIR``, ``-o nocache`` for
mount.ckptfs), and the one warning a folder chosen but unusable gets."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ckptfs.cache.store import FOLDER
from ckptfs.cache_dir import cache_folder, default_cache_dir
from ckptfs.cli.printable import printable
from ckptfs.errors import CkptfsError


def add_cache_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("caching on disk")
    group.add_argument("--cache-dir", metavar="DIR", type=Path,
                       help="where to cache parsed metadata (repeat opens of an unchanged checkpoint) and remote "
                            "blocks (default: $XDG_CACHE_HOME/ckptfs, else ~/.cache/ckptfs)")
    group.add_argument("--no-cache", action="store_true", help="neither read nor write the cache on disk")


def cache_dir(args: argparse.Namespace) -> Path | None:
    """The cache folder the command uses, or None with --no-cache, or when the --cache-dir given is unusable (then
    warned about once: the command goes on without a cache)."""
    folder = chosen_cache_dir(args.no_cache, args.cache_dir, f"--cache-dir {args.cache_dir}")
    if folder is None:
        args.no_cache = True  # warned once, even when several options ask for the folder
    return folder


def chosen_cache_dir(no_cache: bool, chosen: Path | None, named: str) -> Path | None:
    """The cache folder: none (``no_cache``), the one ``chosen`` (None if unusable, warned about on stderr as
    ``named``), else the default."""
    if no_cache:
        return None
    if chosen is None:
        return default_cache_dir()
    return chosen if usable_cache_dir(chosen, named) else None


def usable_cache_dir(folder: Path, named: str) -> bool:
    """Whether ckptfs can keep its metadata cache in ``folder``; if not, says why on stderr, one line naming the
    folder as the user gave it (``named``).

    The default folder is not checked here: an unusable one (a home without ``~/.cache``) is passed over silently,
    as the user did not ask for it. A missing folder is made only where its parent is: a mistyped path does not
    become a chain of new directories."""
    if not folder.exists() and not folder.parent.is_dir():
        return _warn(named, f"its parent folder {folder.parent} does not exist (only the last level is made)")
    try:
        metadata = cache_folder(folder, FOLDER)
    except CkptfsError as exc:
        return _warn(named, str(exc))
    if not os.access(metadata, os.R_OK | os.W_OK | os.X_OK):
        return _warn(named, f"cache folder {metadata}: not readable and writable by this user")
    return True


def _warn(named: str, reason: str) -> bool:
    print(f"ckptfs: warning: {printable(named)} is unusable: {printable(reason)}; going on without the cache",
          file=sys.stderr, flush=True)
    return False
