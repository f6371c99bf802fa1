"""``file_crc32``: the CRC-32 of a file's range through its page cache, against zlib's of the same bytes."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ckptfs.saving.file_crc
from ckptfs.saving.file_crc import file_crc32


@settings(max_examples=60, deadline=None)
@given(data=st.binary(min_size=1, max_size=20_000), cut=st.data(), seed=st.integers(0, 2**32 - 1))
def test_equals_zlib_over_any_range_and_window(tmp_path_factory: pytest.TempPathFactory, data: bytes,
                                              cut: st.DataObject, seed: int) -> None:
    path = tmp_path_factory.mktemp("crc") / "f"
    path.write_bytes(data)
    start = cut.draw(st.integers(0, len(data)))
    end = cut.draw(st.integers(start, len(data)))
    window = cut.draw(st.sampled_from([1, 7, 4096, 1 << 20]))
    old = ckptfs.saving.file_crc.WINDOW
    ckptfs.saving.file_crc.WINDOW = window
    fd = os.open(path, os.O_RDONLY)
    try:
        assert file_crc32(fd, start, end - start, seed) == zlib.crc32(data[start:end], seed)
    finally:
        os.close(fd)
        ckptfs.saving.file_crc.WINDOW = old


def test_a_range_past_the_end_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(ValueError, match="mmap"):
            file_crc32(fd, 50, 100)
    finally:
        os.close(fd)
