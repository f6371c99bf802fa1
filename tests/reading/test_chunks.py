"""The gather of chunked tensors, against numpy: random shapes cut into random grids of boxes, stored in C or
Fortran order, listed in random order; any byte range of the whole tensor."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptfs.errors import CorruptCheckpointError
from ckptfs.formats.interface import ParsedCheckpoint
from ckptfs.model.dtypes import dtype_by_name
from ckptfs.model.records import Chunk, Storage, Tensor
from ckptfs.reading.chunks import elements_before
from ckptfs.reading.storage import StorageReader
from ckptfs.reading.tensor import read_tensor
from ckptfs.sources import BytesSource


@dataclass
class _Parsed(ParsedCheckpoint):
    def chunk_tensor(self, chunk: Chunk, dtype_name: str) -> Tensor:
        assert chunk.tensor is not None and chunk.tensor.dtype.name == dtype_name
        return chunk.tensor


def _chunk(array: np.ndarray, offsets: tuple[int, ...], sizes: tuple[int, ...], dtype: str, fortran: bool) -> Chunk:
    box = array[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))]
    stored = np.asfortranarray(box) if fortran else np.ascontiguousarray(box)
    data = stored.tobytes(order="F" if fortran else "C")
    strides = tuple(s // stored.itemsize for s in stored.strides)
    storage = Storage("0", dtype_by_name(dtype), "cpu", box.size, inline_data=data)  # type: ignore[arg-type]
    inner = Tensor(storage.dtype, sizes, strides, 0, storage)
    return Chunk(offsets, sizes, "f", 0, len(data), tensor=inner)


def _tensor(array: np.ndarray, dtype: str, boxes: list[tuple[tuple[int, ...], tuple[int, ...]]],
            layouts: list[bool]) -> tuple[Tensor, StorageReader]:
    chunks = [_chunk(array, o, s, dtype, f) for (o, s), f in zip(boxes, layouts)]
    shape = array.shape
    stride = tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape)))
    tensor = Tensor(dtype_by_name(dtype), shape, stride, 0, None, chunks=chunks)  # type: ignore[arg-type]
    return tensor, StorageReader(BytesSource(b""), _Parsed("test", tensor, []))


def _grid(shape: tuple[int, ...], cuts: list[list[int]]) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    edges = [[0, *sorted(set(c)), n] for c, n in zip(cuts, shape)]
    spans = [[(a, b - a) for a, b in zip(e, e[1:]) if b > a] for e in edges]
    return [(tuple(o for o, _ in box), tuple(n for _, n in box)) for box in itertools.product(*spans)]


@st.composite
def chunked(draw: st.DrawFn) -> tuple[np.ndarray, str, list, list[bool]]:
    shape = tuple(draw(st.lists(st.integers(1, 7), min_size=0, max_size=4)))
    cuts = [draw(st.lists(st.integers(1, max(1, n - 1)), max_size=3)) if n > 1 else [] for n in shape]
    dtype = draw(st.sampled_from(["float32", "int16", "uint8", "float64"]))
    numpy_dtype = dtype_by_name(dtype).numpy  # type: ignore[union-attr]
    array = np.arange(int(np.prod(shape)), dtype=np.int64).astype(numpy_dtype).reshape(shape)
    boxes = draw(st.permutations(_grid(shape, cuts)))
    layouts = draw(st.lists(st.booleans(), min_size=len(boxes), max_size=len(boxes)))
    return array, dtype, list(boxes), layouts


@settings(max_examples=300, deadline=None)
@given(chunked(), st.data())
def test_any_byte_range_is_numpys(case: tuple[np.ndarray, str, list, list[bool]], data: st.DataObject) -> None:
    array, dtype, boxes, layouts = case
    tensor, reader = _tensor(array, dtype, boxes, layouts)
    whole = array.tobytes()
    assert read_tensor(reader, tensor) == whole
    for _ in range(5):
        offset = data.draw(st.integers(0, len(whole)))
        size = data.draw(st.integers(0, len(whole) + 3))
        assert read_tensor(reader, tensor, offset, size) == whole[offset : offset + size]


@settings(max_examples=200, deadline=None)
@given(chunked(), st.data())
def test_elements_before_counts_the_box(case: tuple[np.ndarray, str, list, list[bool]], data: st.DataObject) -> None:
    array, _, boxes, _ = case
    offsets, sizes = boxes[0]
    inside = np.zeros(array.shape, dtype=bool)
    inside[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))] = True
    flat = inside.reshape(-1)
    position = data.draw(st.integers(-2, flat.size + 2))
    chunk = Chunk(offsets, sizes, "f", 0, 0)
    assert elements_before(chunk, array.shape, position) == int(flat[: max(0, position)].sum())


def test_overlapping_chunks_and_holes_are_errors() -> None:
    array = np.arange(24, dtype=np.float32).reshape(4, 6)
    boxes = _grid((4, 6), [[2], [3]])
    tensor, reader = _tensor(array, "float32", [boxes[0], boxes[0], boxes[2], boxes[3]], [False] * 4)
    with pytest.raises(CorruptCheckpointError, match=r"chunks of tensor \(\) overlap \(the one at \[0, 0\]"):
        read_tensor(reader, tensor)
    tensor, reader = _tensor(array, "float32", boxes[1:], [False] * 3)
    with pytest.raises(CorruptCheckpointError, match=r"no chunk of tensor \(\) holds element 0 \(index \[0, 0\]\)"):
        read_tensor(reader, tensor)
    assert read_tensor(reader, tensor, 12, 12) == array.tobytes()[12:24]  # only what is asked is checked
