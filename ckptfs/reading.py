"""Turns a read of a tensor's logical bytes into ranged reads of its storage.

Contiguous tensors of a stored little-endian record are one ranged read.
Everything else (strided views, big-endian sources, conj/neg views) is
gathered by :mod:`ckptfs.gather`, imported on first need so that opening
and mounting do not pay for numpy.
"""

from __future__ import annotations

import threading

from ckptfs.errors import CorruptCheckpointError, UnsupportedError
from ckptfs.formats.parsed import ParsedCheckpoint
from ckptfs.model import Storage, Tensor
from ckptfs.sources import ByteSource

GATHER_ELEMENTS = 1 << 18
"""Elements gathered per step: bounds the index arrays of a strided read."""


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
    from ckptfs.gather import gather

    first, last = offset // es, -(-end // es)
    parts = [gather(reader, tensor, a, min(a + GATHER_ELEMENTS, last)) for a in range(first, last, GATHER_ELEMENTS)]
    data = b"".join(parts)
    skip = offset - first * es
    return data[skip : skip + end - offset]
