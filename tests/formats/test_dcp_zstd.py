"""ZStandard-compressed DCP items: decompressed a little at a time (a tiny frame cannot inflate into gigabytes in
one call), kept in memory within a budget, in a spill file under the cache directory past it, streamed when
there is no room for one; the bytes are torch's every way."""

from __future__ import annotations

import os
import random
import tracemalloc
from pathlib import Path

import pytest
import torch
from dcp_writers import raw_bytes, save
from hostile.dcp_cases import rle_frame

import ckptfs
from ckptfs.errors import CorruptCheckpointError
from ckptfs.formats import dcp_transforms
from ckptfs.formats.dcp_transforms import RecentBlobs, ZstdBlobSource
from ckptfs.sources import BytesSource

SMALL = ckptfs.Limits(max_inflated_bytes=64 << 10)
"""A memory budget below the item's size (about 1 MiB): the item goes to a spill file or is streamed."""


@pytest.fixture(scope="module")
def compressed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.Tensor]:
    from torch.distributed.checkpoint._extension import ZStandard

    tensor = torch.randn(512, 512, generator=torch.Generator().manual_seed(3))
    path = tmp_path_factory.mktemp("zstd") / "ck"
    save({"w": tensor}, path, _extensions=[ZStandard()])
    return path, tensor


def _spill_files(cache: Path) -> list[str]:
    links = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
             if os.path.exists(f"/proc/self/fd/{fd}")]
    return [link for link in links if link.startswith(f"{cache}/ckptfs/")]


def _reads(ck: ckptfs.Checkpoint, want: bytes) -> None:
    record = ck.tensor(("w",))
    assert ck.read(record) == want
    rng = random.Random(0)
    for _ in range(50):
        offset = rng.randrange(len(want) - 4096)
        assert ck.read(record, offset, 4096) == want[offset : offset + 4096]


def test_a_large_item_is_read_from_a_spill_file(compressed: tuple[Path, torch.Tensor], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    path, tensor = compressed
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with ckptfs.open(path, SMALL) as ck:
        _reads(ck, raw_bytes(tensor))
        assert len(_spill_files(tmp_path)) == 1  # unnamed: nothing is left in the directory
        assert os.listdir(tmp_path / "ckptfs") == []


@pytest.mark.parametrize("why", ["no_cache_directory", "spill_budget_spent"])
def test_without_a_spill_file_the_item_streams(compressed: tuple[Path, torch.Tensor], tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch, why: str) -> None:
    path, tensor = compressed
    (tmp_path / "a_file").write_bytes(b"")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a_file" if why == "no_cache_directory" else tmp_path))
    if why == "spill_budget_spent":
        monkeypatch.setattr(dcp_transforms, "SPILL_BYTES", 0)
    with ckptfs.open(path, SMALL) as ck:
        _reads(ck, raw_bytes(tensor))
        assert _spill_files(tmp_path) == []


def test_an_item_within_the_budget_stays_in_memory(compressed: tuple[Path, torch.Tensor], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    path, tensor = compressed
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with ckptfs.open(path) as ck:
        _reads(ck, raw_bytes(tensor))
        assert _spill_files(tmp_path) == []


def test_a_tiny_frame_never_inflates_far_past_its_bound() -> None:
    """A 32 KiB frame of run-length blocks that decompresses to 1 GiB, for an item that may hold 100 MiB: the
    decoder, fed 2 KiB at a time, stops after at most 64 MiB more (fed 1 MiB at once, it made 1 GiB in one call)."""
    frame = BytesSource(rle_frame(8192), "bomb")
    tracemalloc.start()
    try:
        with pytest.raises(CorruptCheckpointError, match=r"zstd frame decompresses to more than 104857600 bytes"):
            ZstdBlobSource(frame, ckptfs.Limits(), RecentBlobs(1 << 40), 100 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 200 << 20, peak >> 20


def test_the_memory_budget_is_bounded() -> None:
    assert RecentBlobs(1 << 40).budget == dcp_transforms.MAX_HELD_BYTES == 256 << 20
    assert RecentBlobs(1 << 20).budget == 1 << 20
