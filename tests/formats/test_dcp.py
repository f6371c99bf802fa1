"""torch.distributed.checkpoint directories written by torch 2.13: the tree, every tensor's bytes and every value
compared with torch's own reading (``dcp_to_torch_save`` and ``dcp.load``) and with the state dict saved."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from dcp_writers import (
    raw_bytes,
    save,
    simulate_ranks,
    simulate_ranks_without_collectives,
    torch_view,
)

import ckptfs
from ckptfs.fs.describe import tensor_metadata
from ckptfs.model.records import Tensor


def _plain_state() -> dict[str, Any]:
    return {
        "w": torch.arange(12, dtype=torch.float32).reshape(3, 4),
        "h": torch.arange(6, dtype=torch.float16).reshape(2, 3).t(),  # saved with its strides (1, 3)
        "s": torch.tensor(7.5, dtype=torch.bfloat16),
        "u": torch.tensor([1, 65535], dtype=torch.uint16),
        "c": torch.tensor([1 + 2j, -3j], dtype=torch.complex64),
        "flags": torch.tensor([True, False, True]),
        "step": 42,
        "name": "hello",
        "a.b": {"c.d": torch.ones(2, dtype=torch.int8)},  # FQN 'a.b.c.d': never split on its dots
        "by_int": {0: torch.full((2,), 3.0), 1: {"x": 5}},  # int dict keys come back as str
        "lst": [torch.arange(3), 3, {"k": torch.zeros(1)}],  # list indices stay ints
        "pair": (torch.arange(4, dtype=torch.int32), 7),  # a tuple is one pickled item, tensor inside
        "floats": [1.5, 2.5],
        "empty": torch.zeros(0, 3),
    }


def _sharded_state() -> tuple[dict[str, Any], dict[str, tuple[int, int]]]:
    state = {
        "model": {
            "wide": torch.arange(7 * 6, dtype=torch.float32).reshape(7, 6),
            "cols": torch.arange(4 * 10, dtype=torch.int16).reshape(4, 10),
            "cube": torch.arange(3 * 5 * 4, dtype=torch.float64).reshape(3, 5, 4),
            "bias": torch.ones(3),
        },
        "step": 5,
    }
    return state, {"model.wide": (0, 3), "model.cols": (1, 4), "model.cube": (1, 3)}


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, Any]]]:
    """Directory and saved state dict of every layout."""
    from torch.distributed.checkpoint._extension import ZStandard

    base = tmp_path_factory.mktemp("dcp")
    plain = _plain_state()
    sharded, cuts = _sharded_state()
    out: dict[str, tuple[Path, dict[str, Any]]] = {}
    save(plain, base / "plain")
    out["plain"] = (base / "plain", plain)
    save(plain, base / "threads", thread_count=2)
    out["threads"] = (base / "threads", plain)
    save(plain, base / "zstd", _extensions=[ZStandard()])
    out["zstd"] = (base / "zstd", plain)
    simulate_ranks(sharded, cuts, base / "sim3", world=3)
    out["sim3"] = (base / "sim3", sharded)
    simulate_ranks(sharded, cuts, base / "sim2_file_per_item", world=2, single_file_per_rank=False)
    out["sim2_file_per_item"] = (base / "sim2_file_per_item", sharded)
    simulate_ranks(sharded, cuts, base / "sim3_zstd", world=3, _extensions=[ZStandard()])
    out["sim3_zstd"] = (base / "sim3_zstd", sharded)
    simulate_ranks_without_collectives(sharded, cuts, base / "no_collectives", world=3)
    out["no_collectives"] = (base / "no_collectives", sharded)
    out["optim"] = (base / "optim", _optimizer_state(base / "optim"))
    return out


def _optimizer_state(path: Path) -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()
    state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
    save(state, path)
    return state


def _expected_tree(value: Any) -> Any:
    """The saved state dict as DCP gives it back: dict keys as str, tuples and non-traversed lists whole."""
    if isinstance(value, dict):
        return {str(k): _expected_tree(v) for k, v in value.items()}
    if isinstance(value, list) and any(isinstance(v, (torch.Tensor, dict)) for v in value):
        return [_expected_tree(v) for v in value]
    return value


def _assert_same(ck: ckptfs.Checkpoint, ours: Any, theirs: Any, path: tuple = ()) -> None:
    """``ours`` (ckptfs' tree) holds ``theirs`` (torch's values): same containers and keys, same bytes."""
    if isinstance(theirs, torch.Tensor):
        assert isinstance(ours, Tensor), path
        assert (ours.dtype.name, ours.shape) == (str(theirs.dtype).removeprefix("torch."), tuple(theirs.shape)), path
        assert ck.read(ours) == raw_bytes(theirs), path
    elif isinstance(theirs, dict):
        assert isinstance(ours, dict) and list(ours) == list(theirs), (path, list(ours), list(theirs))
        for key in theirs:
            _assert_same(ck, ours[key], theirs[key], (*path, key))
    elif isinstance(theirs, (list, tuple)):
        assert type(ours) is type(theirs) and len(ours) == len(theirs), path
        for n, (a, b) in enumerate(zip(ours, theirs)):
            _assert_same(ck, a, b, (*path, n))
    else:
        assert ours == theirs and type(ours) is type(theirs), path


@pytest.mark.parametrize("layout", ["plain", "threads", "zstd", "sim3", "sim2_file_per_item", "sim3_zstd",
                                    "no_collectives", "optim"])
def test_tree_and_bytes_are_the_state_dict_saved(written: dict[str, tuple[Path, dict[str, Any]]],
                                                layout: str) -> None:
    path, state = written[layout]
    with ckptfs.open(path) as ck:
        assert ck.format == "dcp"
        _assert_same(ck, ck.root, _expected_tree(state))


@pytest.mark.parametrize("layout", ["plain", "zstd", "sim3", "sim2_file_per_item", "sim3_zstd", "optim"])
def test_bytes_are_torchs_own_reading(written: dict[str, tuple[Path, dict[str, Any]]], layout: str,
                                      tmp_path: Path) -> None:
    path, _ = written[layout]
    theirs = torch_view(path, tmp_path / "torch.pt")
    with ckptfs.open(path) as ck:
        _assert_same(ck, ck.root, theirs)
        transforms = {c.transforms for t in ck.tensors for c in t.chunks or ()}
        assert transforms == ({("stream.zstd/1",)} if "zstd" in layout else {()})


def test_sharded_tensors_are_dcp_load_s(written: dict[str, tuple[Path, dict[str, Any]]]) -> None:
    path, state = written["sim3"]
    target = {"model": {k: torch.zeros_like(v) for k, v in state["model"].items()}, "step": 0}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(target, checkpoint_id=path, no_dist=True)
    with ckptfs.open(path) as ck:
        for key, tensor in target["model"].items():
            assert ck.read(ck.tensor(("model", key))) == raw_bytes(tensor)
            assert ck.to_numpy(ck.tensor(("model", key))).tolist() == state["model"][key].tolist()


def test_every_byte_range_of_a_sharded_tensor(written: dict[str, tuple[Path, dict[str, Any]]]) -> None:
    """Ranges that start and end inside elements, and cross chunk and file boundaries (split on dims 1)."""
    path, state = written["sim3"]
    whole = raw_bytes(state["model"]["cube"])
    with ckptfs.open(path) as ck:
        tensor = ck.tensor(("model", "cube"))
        assert len({c.file for c in tensor.chunks or ()}) == 3
        for offset in range(0, len(whole), 37):
            for size in (1, 5, 8, 77, 400):
                assert ck.read(tensor, offset, size) == whole[offset : offset + size], (offset, size)


def test_sidecar_names_the_chunks(written: dict[str, tuple[Path, dict[str, Any]]]) -> None:
    path, _ = written["sim3"]
    reader = dcp.FileSystemReader(path)
    storage = {(index.fqn, tuple(index.offset or ())): info
               for index, info in reader.read_metadata().storage_data.items()}
    with ckptfs.open(path) as ck:
        meta = json.loads(json.dumps(tensor_metadata(ck.tensor(("model", "cols")))))
    assert [c["offsets"] for c in meta["chunks"]] == [[0, 0], [0, 9], [0, 3], [0, 6]]  # the writer's order
    for chunk, source_range in zip(meta["chunks"], meta["source_ranges"]):
        info = storage[("model.cols", tuple(chunk["offsets"]))]
        assert chunk["file"] == info.relative_path and chunk["range"] == [info.offset, info.offset + info.length]
        assert source_range == [chunk["file"], *chunk["range"]]
        assert chunk["sizes"] == ([4, 1] if chunk["offsets"] == [0, 9] else [4, 3])


def test_without_collectives_every_ranks_chunks(written: dict[str, tuple[Path, dict[str, Any]]]) -> None:
    """torch's one-process load reads only rank 0's metadata; ckptfs the union of the ranks, duplicates once."""
    path, state = written["no_collectives"]
    assert not (path / ".metadata").exists() and (path / "__2.metadata").exists()
    with ckptfs.open(path) as ck:
        assert ck.details["metadata_files"] == ["__0.metadata", "__1.metadata", "__2.metadata"]
        assert len(ck.tensor(("model", "bias")).chunks or ()) == 1
        assert len(ck.tensor(("model", "wide")).chunks or ()) == 3
        assert ck.read(ck.tensor(("model", "wide"))) == raw_bytes(state["model"]["wide"])


def test_listing_and_info(written: dict[str, tuple[Path, dict[str, Any]]]) -> None:
    path, _ = written["sim3"]
    with ckptfs.open(path) as ck:
        assert ck.details["chunks"] == 3 + 4 + 3 + 1 and ck.details["files"] == 4
        assert [t.path for t in ck.tensors] == [("model", "wide"), ("model", "cols"), ("model", "cube"),
                                               ("model", "bias")]
        assert ck.extents(ck.tensor(("model", "cols"))) is None  # split on dimension 1


@pytest.mark.parametrize(("layout", "line"), [
    ("sim3", r"chunks: +11 of 4 tensors, torch\.save blobs in 3 files \(\d+\.\d KiB stored\)$"),
    ("sim3_zstd", r"chunks: +11 of 4 tensors, torch\.save blobs in 3 files \(\d+\.\d KiB stored\); 11 compressed "
                  r"\(stream\.zstd/1\)$"),
])
def test_info_shows_the_chunks(written: dict[str, tuple[Path, dict[str, Any]]], layout: str, line: str) -> None:
    """``ckptfs info`` of a DCP directory says where the tensors' data is: chunks in blobs, not storages."""
    from ckptfs.cli.info import overview

    with ckptfs.open(written[layout][0]) as ck:
        lines = overview(ck)
    assert "storages: 0: the tensors' data is in chunks" in [" ".join(line.split()) for line in lines]
    assert any(re.search(line, text) for text in lines), lines


def test_row_shards_are_stored_extents_of_their_files(written: dict[str, tuple[Path, dict[str, Any]]]) -> None:
    """A split along the first dimension is the chunks' data ranges in order: the mount serves them zero-copy."""
    path, state = written["sim3"]
    with ckptfs.open(path) as ck:
        extents = ck.extents(ck.tensor(("model", "wide")))
        assert extents is not None
        assert [Path(e.source.name).name for e in extents] == ["__0_0.distcp", "__1_0.distcp", "__2_0.distcp"]
        assert b"".join(e.source.read(e.offset, e.length) for e in extents) == raw_bytes(state["model"]["wide"])
        assert all(e.source.fileno() is not None for e in extents)
        assert ck.extents(ck.tensor(("model", "cube"))) is None  # split on dimension 1
    path, state = written["plain"]
    with ckptfs.open(path) as ck:
        assert ck.extents(ck.tensor(("h",))) is None  # a transposed chunk is gathered
        (extent,) = ck.extents(ck.tensor(("w",))) or []
        assert extent.source.read(extent.offset, extent.length) == raw_bytes(state["w"])


def test_safetensors_serialization_is_named(tmp_path: Path) -> None:
    """``serialization_format=SAFETENSORS`` stores a tensor as a range of one safetensors file (written here by
    hand, as torch needs the safetensors package for it; torch 2.13's own reader cannot load such a directory):
    values open, the tensor fails to read saying why."""
    import dataclasses
    import pickle
    import struct

    from ckptfs.errors import UnsupportedError

    save({"w": torch.arange(4.0), "step": 3}, tmp_path / "st")
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    data = struct.pack("<Q", len(header)) + header + raw_bytes(torch.arange(4.0))
    (tmp_path / "st" / "__0_1.distcp").write_bytes(data)
    md = pickle.loads((tmp_path / "st" / ".metadata").read_bytes())
    key = next(k for k in md.storage_data if k.fqn == "w")
    md.storage_data[key] = dataclasses.replace(md.storage_data[key], relative_path="__0_1.distcp", offset=0, length=16)
    (tmp_path / "st" / ".metadata").write_bytes(pickle.dumps(md))
    with ckptfs.open(tmp_path / "st") as ck:
        assert ck.root["step"] == 3
        with pytest.raises(UnsupportedError, match=r"^.*: the chunk at \[0\] is stored in safetensors form in "
                                                   r"'__0_1.distcp' \(saved with serialization_format=SAFETENSORS\)"):
            ck.read(ck.tensor(("w",)))
