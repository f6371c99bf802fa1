"""Turns a read of a tensor's logical bytes into ranged reads of its storage.

Contiguous tensors of a stored little-endian record are one ranged read.
Everything else (strided views, big-endian sources, conj/neg views) is
gathered with numpy from the runs of storage the requested range touches.
"""

from __future__ import annotations

import threading

import numpy as np

from ckptfs.errors import CorruptCheckpointError, UnsupportedError
from ckptfs.formats.parsed import ParsedCheckpoint
from ckptfs.model import Storage, Tensor
from ckptfs.sources import ByteSource

GATHER_ELEMENTS = 1 << 18
"""Elements gathered per step: bounds the index arrays of a strided read."""
RUN_GAP = 16 * 1024
"""Storage gaps up to this many bytes are read through rather than split into two reads."""
DENSE_SPAN_FACTOR = 8
"""A strided chunk whose storage span is at most this multiple of its bytes is read in one go."""

_SIGN_BITS = {2: np.uint16(0x8000), 4: np.uint32(0x80000000), 8: np.uint64(0x8000000000000000)}
_FLOAT_NAMES = {"float16", "bfloat16", "float32", "float64", "complex32", "complex64", "complex128"}
_INT_NAMES = {"int8", "int16", "int32", "int64"}


class StorageReader:
    """Reads byte ranges of storages, checking each storage's framing once."""

    def __init__(self, source: ByteSource, parsed: ParsedCheckpoint) -> None:
        self.source = source
        self.parsed = parsed
        self._verified: set[int] = set()
        self._inflated: dict[int, bytes] = {}
        self._lock = threading.Lock()

    def read(self, storage: Storage, offset: int, length: int) -> bytes:
        if offset < 0 or offset + length > storage.nbytes:
            raise CorruptCheckpointError(f"read past the end of storage {storage.key!r}")
        if storage.inline_data is not None:
            return storage.inline_data[offset : offset + length]
        if id(storage) not in self._verified:
            self._verify(storage)
        if storage.compressed:
            return self._inflate(storage)[offset : offset + length]
        return self.source.read(storage.offset + offset, length)

    def _verify(self, storage: Storage) -> None:
        if self.parsed.verify is not None:
            self.parsed.verify(storage)
        with self._lock:
            self._verified.add(id(storage))

    def _inflate(self, storage: Storage) -> bytes:
        data = self._inflated.get(id(storage))
        if data is None:
            assert self.parsed.inflate is not None
            data = self.parsed.inflate(storage)
            with self._lock:
                self._inflated = {id(storage): data}
        return data


def needs_gather(tensor: Tensor) -> bool:
    storage = tensor.storage
    swapped = storage is not None and storage.byteorder == "big" and tensor.dtype.swap_unit > 1
    return not tensor.is_contiguous or swapped or tensor.conj or tensor.neg


def read_tensor(reader: StorageReader, tensor: Tensor, offset: int = 0, size: int | None = None) -> bytes:
    """Bytes ``[offset, offset+size)`` of the tensor's logical C-order bytes (clamped to its end)."""
    if not tensor.has_data:
        raise UnsupportedError(f"tensor {tensor.path!r} has no data ({tensor.kind})")
    nbytes = tensor.nbytes
    if offset < 0:
        raise ValueError("offset must not be negative")
    end = nbytes if size is None else min(nbytes, offset + max(size, 0))
    if offset >= end:
        return b""
    storage = tensor.storage
    assert storage is not None
    es = tensor.itemsize
    if tensor.dtype.packing > 1:
        if tensor.storage_offset % tensor.dtype.packing:
            raise UnsupportedError(f"packed {tensor.dtype.name} tensor starts inside a byte")
        if not tensor.is_contiguous:
            raise UnsupportedError(f"non-contiguous {tensor.dtype.name} tensors are not readable")
        return reader.read(storage, tensor.storage_offset // tensor.dtype.packing + offset, end - offset)
    if not needs_gather(tensor):
        return reader.read(storage, tensor.storage_offset * es + offset, end - offset)
    first, last = offset // es, -(-end // es)
    parts = [_gather(reader, tensor, a, min(a + GATHER_ELEMENTS, last)) for a in range(first, last, GATHER_ELEMENTS)]
    data = b"".join(parts)
    skip = offset - first * es
    return data[skip : skip + end - offset]


def _gather(reader: StorageReader, tensor: Tensor, first: int, last: int) -> bytes:
    """Logical elements ``[first, last)``, transformed, as bytes."""
    storage = tensor.storage
    assert storage is not None
    es = tensor.itemsize
    if tensor.is_contiguous:
        raw = reader.read(storage, (tensor.storage_offset + first) * es, (last - first) * es)
        return _transform(np.frombuffer(raw, dtype=np.uint8).copy(), tensor).tobytes()
    positions = _positions(tensor, first, last)
    lo, hi = int(positions.min()), int(positions.max()) + 1
    if (hi - lo) <= DENSE_SPAN_FACTOR * (last - first):
        block = np.frombuffer(reader.read(storage, lo * es, (hi - lo) * es), dtype=np.uint8).reshape(-1, es)
        rows = block[positions - lo]
    else:
        rows = _gather_runs(reader, storage, positions, es)
    return _transform(np.ascontiguousarray(rows).reshape(-1), tensor).tobytes()


def _positions(tensor: Tensor, first: int, last: int) -> np.ndarray:
    """Storage element index of each logical element in ``[first, last)``."""
    indices = np.unravel_index(np.arange(first, last, dtype=np.int64), tensor.shape)
    positions = np.full(last - first, tensor.storage_offset, dtype=np.int64)
    for index, stride in zip(indices, tensor.stride):
        if stride:
            positions += index * stride
    return positions


def _gather_runs(reader: StorageReader, storage: Storage, positions: np.ndarray, es: int) -> np.ndarray:
    unique = np.unique(positions)
    breaks = np.nonzero(np.diff(unique) * es > RUN_GAP)[0] + 1
    starts = np.concatenate(([unique[0]], unique[breaks]))
    ends = np.concatenate((unique[breaks - 1], [unique[-1]])) + 1
    bases = np.concatenate(([0], np.cumsum(ends - starts)[:-1]))
    block = np.frombuffer(
        b"".join(reader.read(storage, int(s) * es, int(e - s) * es) for s, e in zip(starts, ends)), dtype=np.uint8
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
