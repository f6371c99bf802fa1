"""ZStandard-compressed DCP items: decompressed a little at a time (a tiny frame cannot inflate into gigabytes in
one call), kept in memory within a budget, in a spill file under the cache directory past it, streamed when
there is no room for one; the bytes are torch's every way."""

from __future__ import annotations

import os
import random
import sys
import tomllib
import tracemalloc
import types
from pathlib import Path

import pytest
import torch
import zstandard
from dcp_writers import raw_bytes, save
from hostile.dcp_cases import rle_frame

import ckptfs
from ckptfs.errors import CorruptCheckpointError, UnsupportedError
from ckptfs.formats import dcp_transforms
from ckptfs.formats.dcp_transforms import RecentBlobs, ZstdBlobSource
from ckptfs.sources import BytesSource

FRAME = zstandard.ZstdCompressor().compress(bytes(range(256)) * 64)
SMALL = ckptfs.Limits(max_inflated_bytes=64 << 10)
"""A memory budget below the item's size (about 1 MiB): the item goes to a spill file or is streamed."""


@pytest.fixture(scope="module")
def compressed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.Tensor]:
    from torch.distributed.checkpoint._extension import ZStandard

    tensor = torch.randn(512, 512, generator=torch.Generator().manual_seed(3))
    path = tmp_path_factory.mktemp("zstd") / "ck"
    save({"w": tensor}, path, _extensions=[ZStandard()])
    return path, tensor


@pytest.fixture(params=["compression.zstd", "zstandard"])
def decoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each decoder ckptfs may find, the other made unimportable: Python 3.14's ``compression.zstd`` (below 3.14,
    ``backports.zstd``, the same module, stands in for it) or the ``zstandard`` wheel."""
    if request.param == "compression.zstd":
        if sys.version_info < (3, 14):
            from backports import zstd

            monkeypatch.setitem(sys.modules, "compression", types.SimpleNamespace(zstd=zstd))
            monkeypatch.setitem(sys.modules, "compression.zstd", zstd)
        monkeypatch.setitem(sys.modules, "zstandard", None)
    else:
        monkeypatch.setitem(sys.modules, "compression.zstd", None)
        monkeypatch.delitem(sys.modules, "compression", raising=False)
    return request.param


def test_the_default_install_has_a_decoder() -> None:
    """No extra to install: below Python 3.14 the zstandard wheel is a dependency of ckptfs itself."""
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    assert "zstandard>=0.22; python_version < '3.14'" in project["dependencies"]
    assert "zstd" not in project["optional-dependencies"]


def test_without_any_decoder_the_error_says_what_is_missing(compressed: tuple[Path, torch.Tensor],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "compression.zstd", None)
    monkeypatch.setitem(sys.modules, "zstandard", None)
    with ckptfs.open(compressed[0]) as ck, pytest.raises(UnsupportedError, match=(
            r"saved with the ZStandard extension, and this Python has neither compression.zstd nor the "
            r"zstandard package that ckptfs depends on: reinstall ckptfs")):
        ck.read(ck.tensor(("w",)))


def test_either_decoder_reads_torch_s_bytes(compressed: tuple[Path, torch.Tensor], decoder: str) -> None:
    path, tensor = compressed
    with ckptfs.open(path) as ck:
        _reads(ck, raw_bytes(tensor))


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_either_decoder_refuses_a_damaged_frame_alike(decoder: str, damage: str) -> None:
    data = {"truncated": FRAME[:-5], "corrupt": FRAME[:8] + bytes(16) + FRAME[24:]}[damage]
    with pytest.raises(CorruptCheckpointError, match=r"zstd frame is (truncated|corrupt)"):
        source = ZstdBlobSource(BytesSource(data, "frame"), ckptfs.Limits(), RecentBlobs(1 << 20), 1 << 20)
        source.read(0, source.size)


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


def test_a_tiny_frame_never_inflates_far_past_its_bound(decoder: str) -> None:
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
