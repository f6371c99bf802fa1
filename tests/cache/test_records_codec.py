"""Tensor and storage columns of an entry: a form (shape, stride) decoded once and shared, as the parse shares it;
records kept as the prefix they are; the check that every tensor fits its storage the same on its int64 path and its
exact one, and the same as ``rebuild.make_tensor``'s rule."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from corpus import save_zip
from hypothesis import given, settings
from hypothesis import strategies as st

from cache.helpers import entries
from ckptfs.cache import records_codec
from ckptfs.cache.errors import BadEntry
from ckptfs.cache.parsed_codec import decode_parsed, encode_parsed
from ckptfs.checkpoint import open_checkpoint
from ckptfs.formats.detect import open_parsed
from ckptfs.limits import Limits
from ckptfs.model.rebuild import MAX_ELEMENTS
from ckptfs.model.records import RecordPrefix
from ckptfs.sources import LocalFileSource


def test_tensors_of_one_form_share_its_tuples_and_records_keep_their_prefix(tmp_path: Path, cache_dir: Path) -> None:
    state = {"a": torch.zeros(4, 8), "b": torch.ones(4, 8), "c": torch.ones(8, 4).t(), "d": torch.arange(3)}
    path = save_zip(state, tmp_path / "forms.pt")
    with open_checkpoint(path, cache_dir=cache_dir) as parsed:
        expected = [(t.shape, t.stride, t.storage.record) for t in parsed.tensors]  # type: ignore[union-attr]
    assert entries(cache_dir)
    with open_checkpoint(path, cache_dir=cache_dir) as cached:
        a, b, c, d = cached.tensors
        assert [(t.shape, t.stride, t.storage.record) for t in cached.tensors] == expected  # type: ignore[union-attr]
        assert (a.shape, a.stride) == ((4, 8), (8, 1)) and c.stride == (1, 4)
        assert a.shape is b.shape and a.stride is b.stride
        assert c.shape == a.shape and c.stride is not a.stride
        prefixes = {id(t.storage.stored_record) for t in cached.tensors}  # type: ignore[union-attr]
        assert len(prefixes) == 1 and type(d.storage.stored_record) is RecordPrefix  # type: ignore[union-attr]
        assert cached.read(c) == state["c"].contiguous().numpy().tobytes()


def fits(shape: list[int], stride: list[int], offset: int, itemsize: int, room: int) -> bool:
    """``rebuild.make_tensor``'s rule, for a float32 tensor in a float32 storage of ``room`` bytes."""
    if math.prod(shape) > MAX_ELEMENTS:
        return False
    if 0 in shape:
        return True
    last = offset + sum((n - 1) * s for n, s in zip(shape, stride))
    return (last + 1) * itemsize <= room


@pytest.fixture(scope="module")
def one_tensor(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = save_zip({"t": torch.zeros(64)}, tmp_path_factory.mktemp("forms") / "one.pt")
    source = LocalFileSource(path)
    yield source, encode_parsed(open_parsed(source, Limits()), source)
    source.close()


DIM = st.one_of(st.integers(0, 9), st.integers(0, 70), st.integers(0, 1 << 40),
                st.sampled_from([(1 << 24) - 1, 1 << 24, (1 << 62) + 1]))


@settings(max_examples=300, deadline=None)
@given(data=st.data())
@pytest.mark.parametrize("path", ["int64", "exact"])
def test_a_tensor_fits_its_storage_on_either_path_as_make_tensor_says(one_tensor: Any, path: str,
                                                                       data: st.DataObject) -> None:
    source, sections = one_tensor
    rank = data.draw(st.integers(0, 3))
    shape = data.draw(st.lists(DIM, min_size=rank, max_size=rank))
    stride = data.draw(st.lists(DIM, min_size=rank, max_size=rank))
    last = sum((n - 1) * s for n, s in zip(shape, stride) if n)
    edge = max(0, 63 - last + data.draw(st.integers(-2, 2)))  # the last element at, or about, the storage's end
    offset = data.draw(st.one_of(st.just(edge), st.integers(0, 70), st.integers(0, (1 << 62))))
    hostile = {**sections, "form_ndim": np.asarray([rank], dtype=np.int64),
               "form_dims": np.asarray(shape + stride, dtype=np.int64),
               "tensor_offset": np.asarray([offset], dtype=np.int64)}
    with pytest.MonkeyPatch.context() as patch:
        if path == "exact":
            patch.setattr(records_codec, "FAST_DIM", 0)
            patch.setattr(records_codec, "EXACT_BELOW", 0)
        if fits(shape, stride, offset, 4, 64 * 4):
            (tensor,) = decode_parsed(hostile, source, Limits()).root.values()
            assert (tensor.shape, tensor.stride, tensor.storage_offset) == (tuple(shape), tuple(stride), offset)
        else:
            with pytest.raises(BadEntry, match="elements lie beyond its storage|more than 2\\*\\*62 elements"):
                decode_parsed(hostile, source, Limits())


@pytest.mark.parametrize(("name", "value", "message"), [
    ("tensor_form", [1], "a tensor has an unknown shape"),
    ("tensor_form", [-1], "a tensor has an unknown shape"),
    ("form_ndim", [65], "a tensor has a bad rank"),
    ("form_dims", [64, -1], "a tensor has a negative size or stride"),
    ("form_dims", [64], "section form_dims has 1 entries, not 2"),
])
def test_bad_forms_are_refused(one_tensor: Any, name: str, value: list[int], message: str) -> None:
    source, sections = one_tensor
    with pytest.raises(BadEntry, match=message):
        decode_parsed({**sections, name: np.asarray(value, dtype=np.int64)}, source, Limits())
