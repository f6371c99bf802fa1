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
from ckptfs.model.records import Chunk, Tensor
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
    out = np.zeros((b - a, es), dtype=np.uint8)
    covered = np.zeros(b - a, dtype=bool)
    strides = _c_strides(tensor.shape)
    for chunk in tensor.chunks or ():
        lo, hi = elements_before(chunk, tensor.shape, a), elements_before(chunk, tensor.shape, b)
        if hi <= lo:
            continue
        inner = reader.parsed.chunk_tensor(chunk, tensor.dtype.name)
        data = np.frombuffer(read_part(reader, inner, lo * es, (hi - lo) * es), dtype=np.uint8).reshape(-1, es)
        places = global_positions(chunk, strides, lo, hi) - a
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


def _c_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))


def elements_before(chunk: Chunk, shape: tuple[int, ...], position: int) -> int:
    """How many of the chunk's elements come before element ``position`` of the whole tensor in C order."""
    numel = chunk.numel
    if position <= 0 or numel == 0:
        return 0
    if position >= math.prod(shape):
        return numel
    count, inner, rest = 0, numel, position
    for size, dim, start, extent in zip(shape, _c_strides(shape), chunk.offsets, chunk.sizes):
        index, rest = divmod(rest, dim)
        inner //= extent
        count += max(0, min(index, start + extent) - start) * inner
        if not start <= index < start + extent:
            break
    return count


def global_positions(chunk: Chunk, strides: tuple[int, ...], lo: int, hi: int) -> np.ndarray:
    """Positions in the whole tensor's C order of the chunk's elements ``[lo, hi)`` (in the chunk's C order)."""
    local = np.arange(lo, hi, dtype=np.int64)
    if not chunk.sizes:
        return local
    positions = np.zeros(hi - lo, dtype=np.int64)
    for index, start, stride in zip(np.unravel_index(local, chunk.sizes), chunk.offsets, strides):
        positions += (index + start) * stride
    return positions
