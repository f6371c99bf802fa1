"""Turns a read of a tensor's logical bytes into ranged reads of its storage.

Contiguous tensors of a stored little-endian record are one ranged read.
Everything else (strided views, big-endian sources, conj/neg views) is
gathered by :mod:`ckptfs.reading.gather`, imported on first need so that
opening and mounting do not pay for numpy.
"""

from __future__ import annotations

from ckptfs.errors import UnsupportedError
from ckptfs.model.records import Tensor
from ckptfs.reading.extents import needs_gather
from ckptfs.reading.storage import StorageReader

GATHER_ELEMENTS = 1 << 18
"""Elements gathered per step: bounds the index arrays of a strided read."""


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
    if tensor.chunks is not None:
        from ckptfs.reading.chunks import read_chunked

        return read_chunked(reader, tensor, offset, end, read_tensor)
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
    from ckptfs.reading.gather import gather

    first, last = offset // es, -(-end // es)
    steps = range(first, last, GATHER_ELEMENTS)
    parts = [gather(reader.read, tensor, a, min(a + GATHER_ELEMENTS, last)) for a in steps]
    data = b"".join(parts)
    skip = offset - first * es
    return data[skip : skip + end - offset]
