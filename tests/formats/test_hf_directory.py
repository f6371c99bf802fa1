"""Directories of safetensors files written by torch 2.13's ``HuggingFaceStorageWriter`` (and the sharded
``save_pretrained`` layout it follows): every tensor's bytes are the ones ``dcp.load`` with
``HuggingFaceStorageReader`` gives; what cannot be read is refused naming the form."""

from __future__ import annotations

import json
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from dcp_writers import raw_bytes
from safetensors.torch import save_file
from torch.distributed.checkpoint import HuggingFaceStorageReader, HuggingFaceStorageWriter

import ckptfs
from ckptfs.errors import CorruptCheckpointError, UnsupportedError


def _save(state: dict[str, Any], path: Path, **options: Any) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, storage_writer=HuggingFaceStorageWriter(str(path), **options), no_dist=True)
    return path


def _state() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(2)
    return {"emb": torch.randn(6, 4, generator=gen).bfloat16(), "lin.weight": torch.randn(3, 5, generator=gen),
            "cnt": torch.tensor([5, -7], dtype=torch.int64), "flags": torch.tensor([True, False])}


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    """Two files and the index, as the writer's ``fqn_to_index_mapping`` puts them."""
    state = _state()
    path = _save(state, tmp_path_factory.mktemp("hf") / "ck",
                 fqn_to_index_mapping={"emb": 1, "lin.weight": 2, "cnt": 2, "flags": 1})
    return path, state


def test_tensors_are_what_torch_reads(sharded: tuple[Path, dict[str, torch.Tensor]]) -> None:
    path, state = sharded
    assert sorted(p.name for p in path.iterdir()) == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json"]
    loaded = {k: torch.zeros_like(v) for k, v in state.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(loaded, storage_reader=HuggingFaceStorageReader(str(path)), no_dist=True)
    weight_map = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
    with ckptfs.open(path) as ck:
        assert ck.format == "safetensors_dir"
        assert list(ck.root) == list(weight_map)
        for fqn, tensor in loaded.items():
            record = ck.root[fqn]
            assert (record.dtype.name, record.shape) == (str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape))
            assert ck.read(record) == raw_bytes(tensor) == raw_bytes(state[fqn])
            (extent,) = ck.extents(record)  # a stored range of its file: served zero-copy
            assert extent.source.name == str(path / weight_map[fqn])
        assert ck.details == {"files": 3, "safetensors_files": 2, "index": True}


def test_nested_state_dicts_are_flat_names(tmp_path: Path) -> None:
    path = _save({"m": {"a": torch.ones(2)}, "n": [torch.arange(3.0)]}, tmp_path / "ck")
    with ckptfs.open(path) as ck:
        assert list(ck.root) == ["m.a", "n.0"]
        assert ck.read(ck.root["n.0"]) == raw_bytes(torch.arange(3.0))


def test_a_directory_of_safetensors_files_without_an_index(tmp_path: Path) -> None:
    """The files in name order, each one's tensors in its header's order (save_file sorts them)."""
    save_file({"b": torch.ones(2), "a": torch.zeros(3)}, str(tmp_path / "2.safetensors"))
    save_file({"c": torch.arange(4, dtype=torch.int32)}, str(tmp_path / "1.safetensors"))
    (tmp_path / "config.json").write_text('{"hidden_size": 4}')
    with ckptfs.open(tmp_path) as ck:
        assert list(ck.root) == ["c", "a", "b"]
        assert ck.read(ck.root["c"]) == raw_bytes(torch.arange(4, dtype=torch.int32))
        assert ck.details["index"] is False


def test_a_non_tensor_item_is_named(tmp_path: Path) -> None:
    """torch 2.13 writes a non-tensor item's torch.save blob in front of the safetensors header, silently."""
    path = _save({"w": torch.ones(2), "step": 5}, tmp_path / "ck")
    with pytest.raises(UnsupportedError, match=re.escape(
            f"{path}: 'model-00001-of-00001.safetensors' holds a torch.save blob before its safetensors header: "
            "HuggingFaceStorageWriter wrote a non-tensor item into it")):
        ckptfs.open(path)


def _one(path: Path, tensors: dict[str, torch.Tensor], name: str, **metadata: str) -> None:
    save_file(tensors, str(path / name), metadata={"format": "pt", **metadata})


@pytest.mark.parametrize(("make", "error", "reason"), [
    (lambda p: (_one(p, {"w": torch.ones(2)}, "a.safetensors"), _one(p, {"w": torch.ones(2)}, "b.safetensors")),
     CorruptCheckpointError, r"tensor 'w' is in two files \(the second: 'b.safetensors'\)"),
    (lambda p: _one(p, {"w": torch.ones(2, 2)}, "a.safetensors",
                    DCP_SHARDING_INFO=json.dumps({"w": {"saved_offsets": [2, 0]}})),
     UnsupportedError, r"a.safetensors: tensor 'w' is a shard at \[2, 0\] of a distributed HuggingFaceStorageWriter "
                       r"save without consolidation"),
    (lambda p: _one(p, {"w": torch.ones(2)}, "a.safetensors", DCP_SHARDING_INFO="[1"),
     CorruptCheckpointError, r"a.safetensors: DCP_SHARDING_INFO is not JSON"),
    (lambda p: (_one(p, {"w": torch.ones(2)}, "a.safetensors"),
                (p / "model.safetensors.index.json").write_text('{"weight_map": {"w": "a.safetensors", '
                                                                '"v": "../b.safetensors"}}')),
     CorruptCheckpointError, r"model.safetensors.index.json lists '../b.safetensors', which is not in the directory"),
    (lambda p: (_one(p, {"w": torch.ones(2)}, "a.safetensors"),
                (p / "model.safetensors.index.json").write_text('{"weight_map": {"w": "a.safetensors", '
                                                                '"v": "a.safetensors"}}')),
     CorruptCheckpointError, r"model.safetensors.index.json lists 'v' in 'a.safetensors', which lacks it"),
    (lambda p: (p / "model.safetensors.index.json").write_text("[1, 2"),
     CorruptCheckpointError, r"model.safetensors.index.json is not JSON"),
    (lambda p: (p / "model.safetensors.index.json").write_text('{"weight_map": [1]}'),
     CorruptCheckpointError, r"model.safetensors.index.json has no weight_map of names to file names"),
])
def test_broken_directories_fail_naming_the_problem(tmp_path: Path, make: Any, error: type, reason: str) -> None:
    make(tmp_path)
    with pytest.raises(error) as info:
        ckptfs.open(tmp_path)
    assert type(info.value) is error and info.value.path == str(tmp_path)
    assert re.search(reason, info.value.reason), info.value.reason

