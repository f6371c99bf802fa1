"""Reads of chunked tensors: a byte range of the whole tensor in C order, gathered from the chunks holding it.

Each chunk is a box of the tensor stored as a tensor of its own. The elements
of a box that fall in a window ``[a, b)`` of the whole tensor's C order are
one run ``[lo, hi)`` of the box's own C order (the map from box order to
tensor order is increasing), so a window reads from each chunk only the bytes
it needs, through the chunk tensor's ordinary read (strides, byte order), and
scatters them to their places. Every window checks that its elements are
covered exactly once, so overlapping chunks or holes are errors, never
silently read bytes.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ckptfs.errors import CorruptCheckpointError, UnsupportedError
from ckptfs.model.records import Chunk, Tensor, contiguous_strides
from ckptfs.reading.storage import StorageReader

ReadPart = Callable[[StorageReader, Tensor, int, int], bytes]
"""``read_tensor(reader, tensor, offset, size)``: bytes of a chunk's own tensor."""
WINDOW_ELEMENTS = 1 << 18
"""Elements gathered per step: bounds the index arrays of a read."""


def read_chunked(reader: StorageReader, tensor: Tensor, offset: int, end: int,
                 read_part: ReadPart) -> bytes:
    """Bytes ``[offset, end)`` of the chunked tensor's logical bytes (``end`` within them)."""
    assert tensor.chunks is not None
    if tensor.dtype.packing > 1:
        raise UnsupportedError(f"chunked {tensor.dtype.name} tensors are not readable")
    es = tensor.itemsize
    first, last = offset // es, -(-end // es)
    parts = [_window(reader, tensor, a, min(a + WINDOW_ELEMENTS, last), read_part)
             for a in range(first, last, WINDOW_ELEMENTS)]
    data = b"".join(parts)
    skip = offset - first * es
    return data[skip : skip + end - offset]


def _window(reader: StorageReader, tensor: Tensor, a: int, b: int, read_part: ReadPart) -> bytes:
    es = tensor.itemsize
    element = np.dtype(f"V{es}")
    out = np.zeros(b - a, dtype=element)
    covered = np.zeros(b - a, dtype=bool)
    strides = contiguous_strides(tensor.shape)
    for chunk in tensor.chunks or ():
        lo, hi = elements_before(chunk, tensor.shape, a), elements_before(chunk, tensor.shape, b)
        if hi <= lo:
            continue
        inner = reader.parsed.chunk_tensor(chunk, tensor.dtype.name)
        data = np.frombuffer(read_part(reader, inner, lo * es, (hi - lo) * es), dtype=element)
        places = global_positions(chunk, tensor.shape, strides, lo, hi)
        if isinstance(places, int):
            places = slice(places - a, places - a + hi - lo)
        else:
            places -= a
        if covered[places].any():
            raise CorruptCheckpointError(f"chunks of tensor {tensor.path!r} overlap (the one at "
                                         f"{list(chunk.offsets)} in {chunk.file!r})")
        covered[places] = True
        out[places] = data
    if not covered.all():
        missing = a + int(np.argmin(covered))
        raise CorruptCheckpointError(f"no chunk of tensor {tensor.path!r} holds element {missing} "
                                     f"(index {[int(i) for i in np.unravel_index(missing, tensor.shape)]})")
    return out.tobytes()


def _run_dims(chunk: Chunk, shape: tuple[int, ...]) -> int:
    """How many leading dimensions index the chunk's runs: the box is whole along every later one but the first."""
    partial = [i for i, (size, whole) in enumerate(zip(chunk.sizes, shape)) if size != whole]
    return partial[-1] if partial else 0


def elements_before(chunk: Chunk, shape: tuple[int, ...], position: int) -> int:
    """How many of the chunk's elements come before element ``position`` of the whole tensor in C order."""
    numel = chunk.numel
    if position <= 0 or numel == 0:
        return 0
    if position >= math.prod(shape):
        return numel
    count, inner, rest = 0, numel, position
    for size, dim, start, extent in zip(shape, contiguous_strides(shape), chunk.offsets, chunk.sizes):
        index, rest = divmod(rest, dim)
        inner //= extent
        count += max(0, min(index, start + extent) - start) * inner
        if not start <= index < start + extent:
            break
    return count


def global_positions(chunk: Chunk, shape: tuple[int, ...], strides: tuple[int, ...], lo: int,
                     hi: int) -> np.ndarray | int:
    """Positions in the whole tensor's C order of the chunk's elements ``[lo, hi)`` (in the chunk's C order); an
    int, the first, when they are consecutive.

    The chunk is a grid of runs, each consecutive in the whole tensor: the run length is the product of its
    sizes from its last partial dimension on."""
    dims = _run_dims(chunk, shape)
    run = math.prod(chunk.sizes[dims:])
    first_run, last_run = lo // run, (hi - 1) // run
    origin = sum(o * s for o, s in zip(chunk.offsets, strides))
    if first_run == last_run or dims == 0:
        return origin + _run_start(chunk, strides, dims, first_run) + lo - first_run * run
    runs = np.arange(first_run, last_run + 1, dtype=np.int64)
    starts = np.full(runs.size, origin, dtype=np.int64)
    for index, stride in zip(np.unravel_index(runs, chunk.sizes[:dims]), strides[:dims]):
        starts += index * stride
    positions = np.add.outer(starts, np.arange(run, dtype=np.int64)).reshape(-1)
    return positions[lo - first_run * run : hi - first_run * run]


def _run_start(chunk: Chunk, strides: tuple[int, ...], dims: int, run: int) -> int:
    """Offset from the chunk's origin, in the whole tensor, of the start of run number ``run``."""
    offset = 0
    for size, stride in zip(reversed(chunk.sizes[:dims]), reversed(strides[:dims])):
        run, index = divmod(run, size)
        offset += index * stride
    return offset
