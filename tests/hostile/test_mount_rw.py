"""``ckptfs mount -o rw`` on every hostile case that opens: every regular file in the mount is written to, and no
byte of the file changes outside the storage ranges of its tensors, but for CRC-32 fields set to the CRC of a
record's bytes. (Cases that do not open fail while parsing, before anything is opened for writing.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import zlib
from pathlib import Path

import pytest

import ckptfs
from hostile.cases import CASES, Case
from hostile.fuzz_write import first_change_outside
from hostile.mounting import Mounts, daemon_serving, mount_points
from mount.helpers import run_cli

WRITTEN = 1 << 20
"""Bytes written at most into each file (a contiguous tensor is never longer than the file holding it)."""


def _storage_ranges(path: Path) -> list[tuple[int, int]]:
    with ckptfs.open(path) as ck:
        return [(s.offset, s.offset + s.nbytes) for s in ck.storages
                if s.offset >= 0 and s.inline_data is None and not s.compressed]


def _write_everything(mnt: Path) -> int:
    """Writes a pattern into every regular file it may open for writing; how many took writes."""
    taken = 0
    found = subprocess.run(["find", mnt, "-type", "f", "-print0"], capture_output=True, check=True, timeout=60)
    for name in filter(None, found.stdout.split(b"\0")):
        try:
            with open(name, "r+b", buffering=0) as f:
                size = min(os.fstat(f.fileno()).st_size, WRITTEN)
                f.write(bytes(range(256)) * (size // 256) + bytes(size % 256))
                taken += 1
        except OSError:
            continue
    return taken


@pytest.mark.parametrize("case", [c for c in CASES if c.error is None and c.name != "deep_then_wide"],
                         ids=lambda c: c.name)
def test_rw_mount_writes_only_inside_storage_ranges(case: Case, hostile_files: dict[str, Path], mounts: Mounts,
                                                    tmp_path: Path) -> None:
    original = hostile_files[case.name]
    if original.is_dir():
        pytest.skip("a directory: -o rw writes only torch.save zip files")
    path = tmp_path / original.name
    shutil.copy(original, path)
    before = path.read_bytes()
    mnt = mounts.directory()
    result = run_cli("mount", "-o", "rw", path, mnt)
    if result.returncode != 0:
        assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
        assert "cannot be opened for writing" in result.stderr or "read-only" in result.stderr, result.stderr
        assert path.read_bytes() == before and str(mnt) not in mount_points()
        return
    mounts.daemons.add(daemon_serving(path))
    _write_everything(mnt)
    unmounted = run_cli("umount", mnt)
    assert unmounted.returncode == 0 and unmounted.stderr == "", unmounted.stderr
    after = path.read_bytes()
    assert len(after) == len(before)
    ranges = _storage_ranges(_copy_of(before, tmp_path))
    record_crcs = {zlib.crc32(after[start:end]).to_bytes(4, "little") for start, end in ranges}
    position = first_change_outside(before, after, ranges, record_crcs)
    assert position is None, f"byte {position} changed outside every storage range"


def _copy_of(data: bytes, directory: Path) -> Path:
    path = directory / "before.pt"
    path.write_bytes(data)
    return path
