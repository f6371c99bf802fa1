"""Differential assertions: a ckptfs checkpoint against the oracle torch gives (see corpus.py)."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from corpus import PACKED_DTYPES, Expected, TensorPath, dtype_name, tensor_components, torch_bytes
from torch import nn

import ckptfs
from ckptfs import NestedTensor, SparseTensor, UnsupportedError
from ckptfs.pickle.values import PickledObject

PARTIAL_READS = 4


def assert_same_paths(ck: ckptfs.Checkpoint, expected: Expected) -> None:
    if expected.first_paths is not None:
        assert [t.path for t in ck.tensors] == expected.first_paths
    assert len(ck.tensors) == expected.distinct
    first_seen: dict[int, TensorPath] = {}
    for path, tensor in expected.tensors.items():
        record = ck.tensor(path)
        assert record.path in expected.tensors, f"{record.path} is not a tensor path in torch's object"
        # Paths holding one torch tensor hold one ckptfs record, and vice versa.
        alias = first_seen.setdefault(id(tensor), path)
        assert (ck.tensor(alias) is record) and (expected.tensors[record.path] is tensor), path


def assert_tensor_matches(ck: ckptfs.Checkpoint, path: TensorPath, t: torch.Tensor, is_parameter: bool,
                          rng: random.Random) -> None:
    record = ck.tensor(path)
    where = f"{ck.path} {path}"
    assert record.dtype.name == dtype_name(t.dtype), where
    assert record.shape == tuple(t.shape), where
    assert record.stride == t.stride(), where
    assert record.storage_offset == t.storage_offset(), where
    assert record.requires_grad == t.requires_grad, where
    assert record.is_parameter == is_parameter, where
    if t.is_meta:
        assert record.kind == "meta" and not record.has_data, where
        with pytest.raises(UnsupportedError, match="no data"):
            ck.read(record)
        return
    data = torch_bytes(t)
    assert record.nbytes == len(data), where
    assert ck.read(record) == data, where
    for _ in range(PARTIAL_READS):
        offset, size = rng.randrange(len(data) + 2), rng.randrange(len(data) + 2)
        assert ck.read(record, offset, size) == data[offset : offset + size], (where, offset, size)
    assert ck.read(record, len(data) // 3) == data[len(data) // 3 :], where
    if record.numpy_dtype is not None and t.dtype not in PACKED_DTYPES:
        array = ck.to_numpy(record)
        assert array.shape == tuple(t.shape) and array.tobytes() == data, where


def assert_same_tree(ours: Any, theirs: Any, path: TensorPath = ()) -> None:
    """The object tree outside tensors: same containers, keys, order and leaf values."""
    if isinstance(theirs, torch.Tensor):
        kind = ckptfs.Tensor if tensor_components(theirs) is None else (SparseTensor, NestedTensor)
        assert isinstance(ours, kind), path
    elif isinstance(theirs, nn.Module):
        assert isinstance(ours, PickledObject), path
        assert_same_tree(ours.state, theirs.__getstate__(), path)
    elif isinstance(theirs, dict):
        assert isinstance(ours, dict) and list(ours) == list(theirs), path
        for key, value in theirs.items():
            assert_same_tree(ours[key], value, path + (key,))
    elif isinstance(theirs, (list, tuple)):
        assert type(ours) is type(theirs) and len(ours) == len(theirs), path
        for index, (mine, value) in enumerate(zip(ours, theirs)):
            assert_same_tree(mine, value, path + (index,))
    elif isinstance(theirs, float):
        assert type(ours) is float, path
        assert (math.isnan(ours) and math.isnan(theirs)) or (
            ours == theirs and math.copysign(1, ours) == math.copysign(1, theirs)), path
    else:
        assert type(ours) is type(theirs) and ours == theirs, path


def check_checkpoint(path: Path, expected: Expected, rng: random.Random) -> None:
    """Every differential check on one file."""
    with ckptfs.open(path) as ck:
        assert_same_paths(ck, expected)
        for tensor_path, t in expected.tensors.items():
            assert_tensor_matches(ck, tensor_path, t, tensor_path in expected.parameters, rng)
        if expected.root is not None:
            assert_same_tree(ck.root, expected.root)


