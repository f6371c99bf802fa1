"""The facade: ckptfs.open, tensor lookup, reads, extents and numpy arrays against what torch wrote."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from corpus import save_legacy, save_zip

import ckptfs
from ckptfs.checkpoint import Checkpoint
from ckptfs.errors import CkptfsError, UnsupportedError
from ckptfs.limits import Limits
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


@pytest.mark.parametrize("limits", [Limits(), Limits(max_tensors=2), Limits(max_key_bytes=20), Limits(max_tree_nodes=3),
                                    Limits(max_tree_depth=0)])
def test_a_flat_state_dict_is_collected_as_the_walk_collects_it(tmp_path: Path, limits: Limits,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    shared = torch.ones(2)
    path = save_zip({"a": shared, "b": torch.zeros(3), "c": shared, 7: torch.arange(2)}, tmp_path / "flat.pt")

    def collect(fast: bool) -> list[tuple[Any, ...]] | str:
        with monkeypatch.context() as patch:
            if not fast:
                patch.setattr(Checkpoint, "_collect_flat", lambda *args: False)
            try:
                with ckptfs.open(path, limits) as ck:
                    return [(t.trail, t.shape) for t in ck.tensors] + [("aliases", ck.alias_count)]
            except CkptfsError as exc:
                return f"{type(exc).__name__}: {exc}"

    assert collect(fast=True) == collect(fast=False)


def test_aliases_key_paths_count_against_max_key_bytes(tmp_path: Path) -> None:
    """``ls`` spells the path to each alias: 1,000 places of one tensor in a module are bounded by them, while at
    the root, where each path is its key, the keys alone count."""
    shared = torch.ones(2)
    places = {f"key{n:04d}": shared for n in range(1000)}  # 9,000 bytes of keys, quoted
    nested = save_zip({"module": places}, tmp_path / "nested.pt")  # and 1,000 paths of 10 bytes to them
    flat = save_zip(places, tmp_path / "flat.pt")
    for path in (nested, flat):
        with ckptfs.open(path) as ck:
            assert (len(ck.tensors), ck.alias_count) == (1, 999)
    with ckptfs.open(flat, Limits(max_key_bytes=9_000)) as ck:
        assert ck.alias_count == 999
    with pytest.raises(CkptfsError, match=r"key paths total more than 8999 bytes \(limit max_key_bytes\)"):
        ckptfs.open(flat, Limits(max_key_bytes=8_999))
    with ckptfs.open(nested, Limits(max_key_bytes=19_008)) as ck:
        assert ck.alias_count == 999
    with pytest.raises(CkptfsError, match=r"more than 19007 bytes \(limit max_key_bytes\)"):
        ckptfs.open(nested, Limits(max_key_bytes=19_007))


def test_open_pauses_the_garbage_collector_while_parsing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    import ckptfs.checkpoint

    parse = ckptfs.checkpoint.open_parsed
    collecting = []

    def watched(*args: Any) -> Any:
        collecting.append(gc.isenabled())
        return parse(*args)

    monkeypatch.setattr(ckptfs.checkpoint, "open_parsed", watched)
    path = save_zip(_state(), tmp_path / "ck.pt")
    assert gc.isenabled()
    with ckptfs.open(path) as ck:
        assert collecting == [False] and gc.isenabled()
        assert len(ck.tensors) == 4
