"""The facade: ckptfs.open, tensor lookup, reads, extents and numpy arrays against what torch wrote."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from corpus import save_legacy, save_zip

import ckptfs
from ckptfs.errors import UnsupportedError
from ckptfs.sources import BytesSource


def _state() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(11)
    base = torch.randn(6, 4, generator=gen)
    return {"w": base, "t": base.t(), "half": base.to(torch.bfloat16), "i": torch.arange(5, dtype=torch.int64)}


@pytest.mark.parametrize("save", [save_zip, save_legacy], ids=["zip", "legacy"])
def test_lookup_read_and_numpy_equal_torch(tmp_path: Path, save) -> None:  # type: ignore[no-untyped-def]
    state = _state()
    path = save(state, tmp_path / "ck.pt")
    with ckptfs.open(path) as ck:
        assert [t.path for t in ck] == [("w",), ("t",), ("half",), ("i",)]
        for key in ("w", "t", "i"):
            tensor = ck.tensor((key,))
            assert np.array_equal(ck.to_numpy(tensor), state[key].numpy())
            assert ck.read(tensor, offset=4, size=8) == state[key].contiguous().numpy().tobytes()[4:12]
        with pytest.raises(UnsupportedError, match=f"{path}: numpy has no dtype for bfloat16"):
            ck.to_numpy(ck.tensor(("half",)))
        with pytest.raises(KeyError):
            ck.tensor(("missing",))


def test_extents_name_the_bytes_in_the_file(tmp_path: Path) -> None:
    state = _state()
    path = save_zip(state, tmp_path / "ck.pt")
    raw = path.read_bytes()
    with ckptfs.open(path) as ck:
        (extent,) = ck.extents(ck.tensor(("w",)))
        assert extent.source is ck.source
        assert raw[extent.offset : extent.offset + extent.length] == state["w"].numpy().tobytes()
        assert ck.extents(ck.tensor(("t",))) is None  # a transposed view is gathered


def test_a_byte_source_opens_like_a_file(tmp_path: Path) -> None:
    path = save_zip(_state(), tmp_path / "ck.pt")
    with ckptfs.open(BytesSource(path.read_bytes(), "in-memory")) as ck, ckptfs.open(path) as on_disk:
        assert ck.path == "in-memory"
        assert [ck.read(t) for t in ck] == [on_disk.read(t) for t in on_disk]
        assert ck.extents(ck.tensors[0]) is not None and ck.source.fileno() is None
