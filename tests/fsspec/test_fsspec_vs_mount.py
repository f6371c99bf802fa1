"""The ``ckpt`` file system shows what a real mount of the same file shows: names, sizes, links and bytes."""

from __future__ import annotations

import os
import posixpath
from pathlib import Path
from typing import Iterator

import pytest
from corpus import CorpusFile
from mount.helpers import Mounter, require_fuse

from ckptfs.fsspec import CheckpointFileSystem

pytestmark = pytest.mark.mount


@pytest.fixture
def mounter(tmp_path: Path) -> Iterator[Mounter]:
    require_fuse()
    mounts = Mounter(tmp_path / "mnt")
    try:
        yield mounts
    finally:
        mounts.cleanup()


@pytest.mark.parametrize("name", ["r1_views_containers", "r2_every_dtype_legacy", "whole_module", "r7_big_endian"])
def test_every_directory_lists_the_entries_of_the_mount(corpus: dict[str, CorpusFile], mounter: Mounter,
                                                        name: str) -> None:
    source = corpus[name].path
    mnt = mounter(source)
    fs = CheckpointFileSystem(fo=str(source))
    for folder, dirs, files in os.walk(mnt):
        relative = os.path.relpath(folder, mnt)
        prefix = "" if relative == "." else relative + "/"
        listed = {entry["name"]: entry for entry in fs.ls(prefix.rstrip("/"))}
        assert list(listed) == [prefix + n for n in os.listdir(folder)]
        for entry_name in dirs + files:
            path = Path(folder) / entry_name
            entry = listed[prefix + entry_name]
            if path.is_symlink():
                target = posixpath.normpath(posixpath.join(relative, os.readlink(path)))
                assert entry["islink"] and entry["destination"] == ("" if target == "." else target)
                assert entry["type"] == ("link" if path.is_dir() else "file")
            elif path.is_dir():
                assert entry["type"] == "directory"
            else:
                assert entry["size"] == path.stat().st_size
                data = path.read_bytes()
                assert fs.cat_file(prefix + entry_name) == data
                assert fs.cat_file(prefix + entry_name, len(data) // 3, len(data) // 2) == \
                    data[len(data) // 3 : len(data) // 2]
