"""Every hostile case through ``ckptfs.open``: inert and bounded, or a CkptfsError naming the file and the problem."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import ckptfs
from ckptfs.errors import CkptfsError
from hostile.cases import CASES, Case
from hostile.checks import TRUNCATION_REASONS, assert_names_file, exercise
from hostile.conftest import CPU_BOUND, WALL_BOUND
from hostile.seeds import SEED_NAMES
from hostile.truncate import truncation_offsets


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_open(case: Case, hostile_files: dict[str, Path]) -> None:
    path = hostile_files[case.name]
    start, cpu_start = time.monotonic(), time.process_time()
    if case.error is None:
        with ckptfs.open(path) as ck:
            assert case.check is not None
            case.check(ck)
            exercise(ck, case.describe_reason)
    else:
        with pytest.raises(case.error) as info:
            ckptfs.open(path)
        assert_names_file(info.value, path, case.reason)
    assert time.monotonic() - start < TIME_BOUND


@pytest.mark.parametrize("seed", SEED_NAMES)
def test_truncated_seed(seed: str, seeds: dict[str, bytes], tmp_path: Path) -> None:
    data = seeds[seed]
    with ckptfs.open(_write(tmp_path / "whole", data)) as ck:
        exercise(ck)
    offsets = truncation_offsets(data)
    assert len(offsets) >= 100
    for offset in offsets:
        path = _write(tmp_path / f"cut{offset}", data[:offset])
        with pytest.raises(CkptfsError) as info:
            ckptfs.open(path)
        assert_names_file(info.value, path, TRUNCATION_REASONS)


def test_truncated_hand_made(hostile_files: dict[str, Path], tmp_path: Path) -> None:
    """Every small hand-made case that opens, cut at a spread of offsets: still a clean failure."""
    small = [c for c in CASES if c.error is None and hostile_files[c.name].stat().st_size < 65536]
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


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path
