"""What the metadata cache's tests look at: the entries in a cache folder, and what opening a hostile one did."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from ckptfs.checkpoint import Checkpoint, open_checkpoint
from ckptfs.errors import CkptfsError


def entries(cache_dir: Path) -> list[Path]:
    folder = cache_dir / "metadata"
    return sorted(folder.glob("*.ckm")) if folder.exists() else []


def written_entries(cache_dir: Path, count: int = 1, timeout: float = 60.0) -> list[Path]:
    """The entries in ``cache_dir`` once there are ``count``: a command (``ls``, ``info``, ``cat``, ``diff``,
    ``mount``) writes its entry from a process of its own that it does not wait for."""
    deadline = time.monotonic() + timeout
    while len(found := entries(cache_dir)) < count:
        assert time.monotonic() < deadline, f"{len(found)} of {count} cache entries in {cache_dir} after {timeout} s"
        time.sleep(0.01)
    return found


def hostile_outcome(path: Path, cache_dir: Path, entry: Path, good: bytes, reference: Any,
                    observe: Callable[[Checkpoint], Any]) -> str:
    """Opens ``path`` with a hostile entry in place: ``"open refused"`` (a ckptfs error), ``"discarded"`` (the
    entry was not used: what ``observe`` sees must equal ``reference``, the parse's) or ``"used"``."""
    try:
        with open_checkpoint(path, cache_dir=cache_dir) as ck:
            opened = observe(ck)
    except CkptfsError:
        return "open refused"
    if not entry.exists() or entry.read_bytes() == good:
        assert opened == reference
        return "discarded"
    return "used"
