"""Deflated records of re-zipped archives: exact bytes from any offset through the seek index, memory bounded."""

from __future__ import annotations

import random
import zipfile
import zlib
from pathlib import Path

import pytest
import torch
from corpus import save_zip, torch_bytes

import ckptfs
from ckptfs.errors import CorruptCheckpointError
from ckptfs.formats import deflate_index
from ckptfs.formats.deflate_index import DeflateIndex
from ckptfs.sources import BytesSource


def _raw_deflate(data: bytes, level: int = 9) -> bytes:
    compressor = zlib.compressobj(level, zlib.DEFLATED, -15)
    return compressor.compress(data) + compressor.flush()


def _index(data: bytes, span: int = 1000, stored: bytes | None = None) -> DeflateIndex:
    packed = _raw_deflate(data) if stored is None else stored
    index = DeflateIndex(BytesSource(b"xx" + packed), "r/data/0", 2, len(packed), len(data))
    index.span = span
    return index


def _payload(size: int) -> bytes:
    rng = random.Random(size)
    return bytes(rng.choice(b"abcdefgh\x00\x00\x00") for _ in range(size))


def test_any_range_reads_exactly_and_leaves_checkpoints() -> None:
    data = _payload(50_000)
    index = _index(data)
    assert index.read(49_990, 10) == data[49_990:]
    assert [c.out_pos for c in index.checkpoints] == list(range(0, 50_000, 1000))
    rng = random.Random(3)
    for _ in range(200):
        offset = rng.randrange(len(data) + 1)
        length = rng.randrange(len(data) - offset + 1)
        assert index.read(offset, length) == data[offset : offset + length]


def test_reads_in_any_order_build_the_same_index() -> None:
    data = _payload(20_000)
    index = _index(data, span=700)
    for offset in (15_000, 100, 19_999, 7_000, 0):
        assert index.read(offset, 1) == data[offset : offset + 1]
    assert [c.out_pos for c in index.checkpoints] == list(range(0, 20_000, 700))


def test_a_large_record_gets_a_longer_span() -> None:
    assert DeflateIndex(BytesSource(b""), "r", 0, 1 << 30, 64 << 30).span == 64 << 20
    assert DeflateIndex(BytesSource(b""), "r", 0, 1 << 20, 1 << 30).span == deflate_index.MIN_SPAN


@pytest.mark.parametrize("case, message", [
    ("short", r"inflates to fewer bytes than its declared 60000"),
    ("long", r"inflates to more than its declared 40000"),
    ("garbage", r"does not inflate"),
    ("ratio", r"of 20 deflated bytes cannot inflate to the 1000000 it declares"),
])
def test_lying_records_fail_when_a_read_reaches_the_lie(case: str, message: str) -> None:
    data = _payload(50_000)
    with pytest.raises(CorruptCheckpointError, match=message):
        if case == "short":
            _index(data + bytes(10_000), stored=_raw_deflate(data)).read(59_000, 1000)
        elif case == "long":
            _index(data[:40_000], stored=_raw_deflate(data)).read(39_000, 1000)
        elif case == "garbage":
            _index(data, stored=b"\xff" * 5000).read(0, 10)
        else:
            DeflateIndex(BytesSource(bytes(20)), "r/data/0", 0, 20, 1_000_000)


def test_a_rezipped_checkpoint_reads_like_torch_without_the_old_cap(tmp_path: Path) -> None:
    """A deflated tensor larger than the former 256 MiB ``max_inflated_bytes`` is scaled down here: a record
    far larger than the memory the index keeps, read from its middle and end."""
    gen = torch.Generator().manual_seed(0)
    state = {"big": torch.randint(0, 4, (3_000_000,), dtype=torch.int32, generator=gen),
             "w": torch.randn(64, 64, generator=gen).t(), "i": torch.arange(100)}
    source = save_zip(state, tmp_path / "ckpt.pt")
    rezipped = tmp_path / "rezipped.pt"
    with zipfile.ZipFile(source) as zin, zipfile.ZipFile(rezipped, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info))
    loaded = torch.load(rezipped)
    with ckptfs.open(rezipped, ckptfs.Limits(max_inflated_bytes=16 << 20)) as ck:
        big = ck.root["big"]
        assert big.storage.compressed and big.nbytes == 12_000_000
        expected = torch_bytes(loaded["big"])
        for offset in (11_999_000, 6_000_001, 17, 4 << 20):
            assert ck.read(big, offset, 1000) == expected[offset : offset + 1000]
        assert ck.read(big) == expected
        for key in ("w", "i"):
            assert ck.read(ck.root[key]) == torch_bytes(loaded[key])
