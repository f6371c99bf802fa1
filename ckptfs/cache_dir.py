"""Where ckptfs keeps what it caches on disk between runs: ``--cache-dir``, else ``$XDG_CACHE_HOME/ckptfs``,
else ``~/.cache/ckptfs``. Each cache has its own folder below it (``metadata/``, ``blocks/``)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ckptfs.errors import CkptfsError

APP_NAME = "ckptfs"


def default_cache_dir() -> Path:
    """The XDG base directory convention's cache folder for ckptfs (not created here)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # the spec says a relative value is invalid and is to be ignored
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / APP_NAME


def cache_folder(cache_dir: Path, name: str) -> Path:
    """``cache_dir/name``, made (mode 0700) if missing; refused if it is not a directory this user owns, since
    another user's folder could hold entries planted for us."""
    folder = cache_dir / name
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = folder.lstat()
    except OSError as exc:
        raise CkptfsError(f"cache folder {folder}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise CkptfsError(f"cache folder {folder}: not a directory owned by this user")
    return folder
