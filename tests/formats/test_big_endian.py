"""Big-endian archives (``byteorder`` = ``big``), written as a big-endian host's torch.save writes them.

Each storage is read as little-endian after swapping by its tensor's element size (complex: each half).
torch 2.13 itself never swaps the dtypes it pickles over an ``UntypedStorage`` (uint16, uint32, uint64,
complex32, bits16), so their expected bytes are spelled out here by hand; for the others torch is the oracle.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from big_endian import save_big_endian
from corpus import torch_bytes

import ckptfs

pytestmark = pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")

NOT_SWAPPED_BY_TORCH = {"u16", "u32", "u64", "c32", "bits16"}


def _state() -> dict[str, torch.Tensor]:
    base = torch.linspace(-2.5, 3.0, 12).reshape(3, 4)
    complex64 = torch.complex(base, -base * 2)
    return {
        "f16": base.half(), "bf16": base.bfloat16().t(), "f32": base, "f32_slice": base[1:, 1:3],
        "f64": base.double().t(), "i16": torch.tensor([1, -2, 300, 0x1234], dtype=torch.int16),
        "i32": torch.tensor([1, -2, 0x12345678], dtype=torch.int32),
        "i64": torch.tensor([[1, -2], [0x123456789ABC, -(1 << 62)]], dtype=torch.int64).t(),
        "c64": complex64, "c64_conj": complex64.conj()[1], "c128": complex64.to(torch.complex128)[:, ::2],
        "u8": torch.tensor([1, 2, 255], dtype=torch.uint8), "i8": torch.tensor([-1, 7], dtype=torch.int8),
        "bool": torch.tensor([True, False]), "f8": base.to(torch.float8_e4m3fn),
        "u16": torch.tensor([1, 2, 0xABCD], dtype=torch.uint16),
        "u32": torch.tensor([1, 2, 0xDEADBEEF], dtype=torch.uint32),
        "u64": torch.tensor([1, 2, 0x0123456789ABCDEF], dtype=torch.uint64),
        "c32": torch.tensor([1.5 - 2j, -0.25 + 4j], dtype=torch.complex32),
        "bits16": torch.tensor([1, 0x1234], dtype=torch.int16).view(torch.bits16),
    }


HAND_MADE: dict[str, bytes] = {
    "u16": struct.pack("<3H", 1, 2, 0xABCD),
    "u32": struct.pack("<3I", 1, 2, 0xDEADBEEF),
    "u64": struct.pack("<3Q", 1, 2, 0x0123456789ABCDEF),
    "c32": struct.pack("<4e", 1.5, -2.0, -0.25, 4.0),
    "bits16": struct.pack("<2H", 1, 0x1234),
}
"""The little-endian bytes of the tensors torch 2.13 loads unswapped, written out without torch."""


@pytest.fixture(scope="module")
def big_endian(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("be") / "big.pt"
    save_big_endian(_state(), path)
    return path


def _storage_bytes(ck: ckptfs.Checkpoint, tensor: Any) -> bytes:
    storage = tensor.storage
    return storage.source.read(storage.offset, storage.nbytes)


def test_the_archive_holds_big_endian_bytes(big_endian: Path) -> None:
    with ckptfs.open(big_endian) as ck:
        assert ck.byteorder == "big"
        assert _storage_bytes(ck, ck.root["u16"]) == bytes.fromhex("00010002abcd")
        assert _storage_bytes(ck, ck.root["c32"])[:4] == struct.pack(">2e", 1.5, -2.0)


def test_each_tensor_reads_swapped_by_its_element_size(big_endian: Path) -> None:
    state = _state()
    loaded = torch.load(big_endian)
    with ckptfs.open(big_endian) as ck:
        for key, tensor in state.items():
            data = ck.read(ck.root[key])
            assert data == torch_bytes(tensor), key
            if key in NOT_SWAPPED_BY_TORCH:
                assert data == HAND_MADE[key], key
                assert torch_bytes(loaded[key]) != data, f"torch 2.13 now swaps {key}: use it as the oracle"
            else:
                assert data == torch_bytes(loaded[key]), key


def test_a_record_less_archive_is_little_endian(tmp_path: Path) -> None:
    """Files from before torch 2.1 have no ``byteorder`` record: torch's default then is little-endian."""
    import zipfile

    source = tmp_path / "little.pt"
    torch.save(_state(), source)
    stripped = tmp_path / "norecord.pt"
    with zipfile.ZipFile(source) as zin, zipfile.ZipFile(stripped, "w", zipfile.ZIP_STORED) as zout:
        for name in zin.namelist():
            if not name.endswith("/byteorder"):
                zout.writestr(name, zin.read(name))
    loaded = torch.load(stripped)
    with ckptfs.open(stripped) as ck:
        assert ck.byteorder == "little"
        for key in loaded:
            assert ck.read(ck.root[key]) == torch_bytes(loaded[key]), key
