"""Gathers the logical bytes of strided, byte-swapped and conj/neg tensors with numpy."""

from __future__ import annotations

from typing import Callable

import numpy as np

from ckptfs.errors import UnsupportedError
from ckptfs.model.records import Storage, Tensor

ReadStorage = Callable[[Storage, int, int], bytes]
"""``read(storage, offset, length)``: bytes of a storage (``StorageReader.read``)."""

RUN_GAP = 16 * 1024
"""Storage gaps up to this many bytes are read through rather than split into two reads."""
DENSE_SPAN_FACTOR = 8
"""A strided chunk whose storage span is at most this multiple of its bytes is read in one go."""

_SIGN_BITS = {2: np.uint16(0x8000), 4: np.uint32(0x80000000), 8: np.uint64(0x8000000000000000)}
_FLOAT_NAMES = {"float16", "bfloat16", "float32", "float64", "complex32", "complex64", "complex128"}
_INT_NAMES = {"int8", "int16", "int32", "int64"}


def gather(read: ReadStorage, tensor: Tensor, first: int, last: int) -> bytes:
    """Logical elements ``[first, last)``, transformed, as bytes."""
    storage = tensor.storage
    assert storage is not None
    es = tensor.itemsize
    if tensor.is_contiguous:
        raw = read(storage, (tensor.storage_offset + first) * es, (last - first) * es)
        return _transform(np.frombuffer(raw, dtype=np.uint8).copy(), tensor).tobytes()
    positions = _positions(tensor, first, last)
    lo, hi = int(positions.min()), int(positions.max()) + 1
    if (hi - lo) <= DENSE_SPAN_FACTOR * (last - first):
        block = np.frombuffer(read(storage, lo * es, (hi - lo) * es), dtype=np.uint8).reshape(-1, es)
        rows = block[positions - lo]
    else:
        rows = _gather_runs(read, storage, positions, es)
    return _transform(np.ascontiguousarray(rows).reshape(-1), tensor).tobytes()


def _positions(tensor: Tensor, first: int, last: int) -> np.ndarray:
    """Storage element index of each logical element in ``[first, last)``."""
    indices = np.unravel_index(np.arange(first, last, dtype=np.int64), tensor.shape)
    positions = np.full(last - first, tensor.storage_offset, dtype=np.int64)
    for index, stride in zip(indices, tensor.stride):
        if stride:
            positions += index * stride
    return positions


def _gather_runs(read: ReadStorage, storage: Storage, positions: np.ndarray, es: int) -> np.ndarray:
    unique = np.unique(positions)
    breaks = np.nonzero(np.diff(unique) * es > RUN_GAP)[0] + 1
    starts = np.concatenate(([unique[0]], unique[breaks]))
    ends = np.concatenate((unique[breaks - 1], [unique[-1]])) + 1
    bases = np.concatenate(([0], np.cumsum(ends - starts)[:-1]))
    block = np.frombuffer(
        b"".join(read(storage, int(s) * es, int(e - s) * es) for s, e in zip(starts, ends)), dtype=np.uint8
    ).reshape(-1, es)
    run = np.searchsorted(starts, positions, side="right") - 1
    return block[bases[run] + positions - starts[run]]


def _transform(raw: np.ndarray, tensor: Tensor) -> np.ndarray:
    """Byte swap to little-endian, then apply conj/neg, on a flat uint8 array."""
    dtype = tensor.dtype
    storage = tensor.storage
    if storage is not None and storage.byteorder == "big" and dtype.swap_unit > 1:
        raw = raw.view(f">u{dtype.swap_unit}").astype(f"<u{dtype.swap_unit}").view(np.uint8)
    if tensor.conj and dtype.is_complex:
        _flip_sign(raw, dtype.swap_unit, imaginary_only=True)
    if tensor.neg:
        if dtype.name in _FLOAT_NAMES:
            _flip_sign(raw, dtype.swap_unit, imaginary_only=False)
        elif dtype.name in _INT_NAMES:
            values = raw.view(f"<i{dtype.itemsize}")
            np.negative(values, out=values)
        else:
            raise UnsupportedError(f"negated view of a {dtype.name} tensor")
    return raw


def _flip_sign(raw: np.ndarray, unit: int, imaginary_only: bool) -> None:
    values = raw.view(f"<u{unit}")
    target = values[1::2] if imaginary_only else values
    np.bitwise_xor(target, _SIGN_BITS[unit], out=target)
