"""Every hostile case through ``ckptfs.open``: inert and bounded, or a CkptfsError naming the file and the problem."""

from __future__ import annotations

import io
import pickletools
import time
import zipfile
from pathlib import Path

import pytest
from counting import CountingSource

import ckptfs
from ckptfs.errors import CkptfsError
from ckptfs.sources import open_source
from hostile.cases import CASES, Case
from hostile.checks import TRUNCATION_REASONS, assert_names_file, exercise
from hostile.conftest import HANG_SECONDS
from hostile.seeds import SEED_NAMES
from hostile.truncate import tar_member_offsets, truncation_offsets


OPEN_READS = 16
"""Reads opening a hostile file may take (at most 6 measured), besides those of ``exercise``."""
READS_A_TENSOR = 4
"""``exercise`` reads each tensor twice; each read checks the record's local header (again while it fails) and
reads the bytes."""


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_open(case: Case, hostile_files: dict[str, Path]) -> None:
    """Opened and exercised (or refused) with its work counted, not timed: a handful of reads to open, a few a
    tensor read, about the file's bytes in all (tensors may share them)."""
    path = hostile_files[case.name]
    source = CountingSource(open_source(path)) if path.is_file() else None
    start = time.monotonic()
    tensors = 0
    if case.error is None:
        with ckptfs.open(source or path) as ck:
            assert case.check is not None
            case.check(ck)
            exercise(ck, case.describe_reason)
            tensors = len(ck.tensors)
    else:
        with pytest.raises(case.error) as info:
            ckptfs.open(source or path)
        assert_names_file(info.value, path, case.reason)
    if source is not None:
        assert len(source.reads) <= OPEN_READS + READS_A_TENSOR * tensors, len(source.reads)
        assert source.bytes_read <= 2 * source.size + (64 << 10), source.bytes_read
    assert time.monotonic() - start < HANG_SECONDS


@pytest.mark.parametrize("seed", SEED_NAMES)
def test_truncated_seed(seed: str, seeds: dict[str, bytes], tmp_path: Path) -> None:
    data = seeds[seed]
    with ckptfs.open(_write(tmp_path / "whole", data)) as ck:
        exercise(ck)
    offsets = truncation_offsets(data)
    assert _structure(data) <= set(offsets)
    assert max(b - a for a, b in zip([0, *offsets], [*offsets, len(data)])) <= 64
    for offset in offsets:
        path = _write(tmp_path / f"cut{offset}", data[:offset])
        with pytest.raises(CkptfsError) as info:
            ckptfs.open(path)
        assert_names_file(info.value, path, TRUNCATION_REASONS)


def test_truncated_hand_made(hostile_files: dict[str, Path], tmp_path: Path) -> None:
    """Every small hand-made case that opens, cut at a spread of offsets: still a clean failure."""
    small = [c for c in CASES if c.error is None and hostile_files[c.name].is_file()
             and hostile_files[c.name].stat().st_size < 65536]
    assert len(small) > 50
    for case in small:
        data = hostile_files[case.name].read_bytes()
        for offset in sorted({*range(0, len(data), max(1, len(data) // 12)), len(data) - 1}):
            path = _write(tmp_path / f"{case.name}.{offset}", data[:offset])
            try:
                with ckptfs.open(path) as ck:
                    exercise(ck)
            except CkptfsError as exc:
                assert_names_file(exc, path, ".")


def _structure(data: bytes) -> set[int]:
    """Where the file's parts start, found by the standard library: for a zip, every record's local header, the
    central directory and its end record; for a legacy stream, the end of each of its five pickles (magic number,
    protocol, system info, the object, the storage keys), the last one where the storages begin."""
    if data[257:262] == b"ustar":
        return set(tar_member_offsets(data))
    if data.startswith(b"PK"):
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            records = {info.header_offset for info in archive.infolist()}
            assert len(records) == len(archive.infolist()) > 1
            return records | {archive.start_dir, data.rindex(b"PK\x05\x06")}
    stream, ends = io.BytesIO(data), set()
    for _ in range(5):
        for _ in pickletools.genops(stream):
            pass
        ends.add(stream.tell())
    assert len(ends) == 5 and max(ends) < len(data)
    return ends


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path
