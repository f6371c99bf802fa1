"""A mount from the metadata cache serves what a mount of the parse serves: the index and every file."""

from __future__ import annotations

import os
from pathlib import Path

from many_tensors import save_many

import ckptfs.cache
from mount.helpers import Mounter


def files(mnt: Path) -> dict[str, bytes]:
    found = {}
    for folder, _, names in os.walk(mnt):
        for name in names:
            path = Path(folder) / name
            found[str(path.relative_to(mnt))] = path.read_bytes()
    return found


def test_a_mount_from_the_cache_serves_the_same_files(mounter: Mounter, tmp_path: Path) -> None:
    source = save_many(tmp_path / "many.pt", ckptfs.cache.MIN_TENSORS + 10)
    cache = tmp_path / "cache"
    parsed = files(mounter(source, "--no-cache"))
    assert not cache.exists()
    first = mounter(source, "--cache-dir", str(cache))
    (entry,) = (cache / "metadata").glob("*.ckm")
    os.utime(entry, ns=(0, 0))
    again = mounter(source, "--cache-dir", str(cache))
    assert entry.stat().st_mtime_ns > 0  # read: a hit marks the entry used
    assert files(first) == parsed
    served = files(again)
    assert served == parsed
    assert ".ckptfs/index.json" in served and len(served) > 2 * ckptfs.cache.MIN_TENSORS
