"""Where a tensor's logical bytes lie in its source, when they lie there as they are.

A tensor whose logical bytes are one stored range (contiguous, little-endian
or byte-order free, uncompressed, not held in the pickle) has extents: the FUSE
layer serves them as file-descriptor buffers and the sidecar lists them as
``source_ranges``. Every other tensor must be gathered (``reading.tensor``).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from ckptfs.model.records import Chunk, Tensor, contiguous_strides
from ckptfs.sources import ByteSource


class Extent(NamedTuple):
    source: ByteSource
    offset: int
    length: int


def needs_gather(tensor: Tensor) -> bool:
    """True when the tensor's logical bytes differ from a slice of its storage's (views, swaps, conj/neg)."""
    storage = tensor.storage
    swapped = storage is not None and storage.byteorder == "big" and tensor.dtype.swap_unit > 1
    return not tensor.is_contiguous or swapped or tensor.conj or tensor.neg


def stored_extents(tensor: Tensor) -> list[Extent] | None:
    """The source ranges holding the tensor's logical bytes in order, or None when they must be gathered."""
    storage = tensor.storage
    if (storage is None or storage.source is None or not tensor.has_data or storage.compressed
            or storage.inline_data is not None or needs_gather(tensor) or tensor.storage_offset % tensor.dtype.packing):
        return None
    start = storage.offset + tensor.storage_offset // tensor.dtype.packing * tensor.itemsize
    return [Extent(storage.source, start, tensor.nbytes)]


def chunk_extents(tensor: Tensor, resolve: Callable[[Chunk], Tensor]) -> list[Extent] | None:
    """A chunked tensor's logical bytes as stored extents of its chunks, when its chunks are consecutive runs of
    it (a split along its leading dimensions, as ``Shard(0)`` makes) stored as they are; else None.

    ``resolve`` gives a chunk's own tensor (its blob parsed and checked)."""
    assert tensor.chunks is not None
    strides = contiguous_strides(tensor.shape)
    runs = sorted(((sum(map(int.__mul__, c.offsets, strides)), c) for c in tensor.chunks if c.numel),
                  key=lambda run: run[0])
    position, extents = 0, []
    for start, chunk in runs:
        if start != position or not _is_run(chunk, tensor.shape):
            return None
        stored = stored_extents(resolve(chunk))
        if stored is None:
            return None
        extents.extend(stored)
        position += chunk.numel
    return extents if position == tensor.numel else None


def _is_run(chunk: Chunk, shape: tuple[int, ...]) -> bool:
    """Whether the box is one run of the tensor's C order: whole along every dimension after its first
    partial one, and one element wide along every dimension before it."""
    partial = [i for i, (size, whole) in enumerate(zip(chunk.sizes, shape)) if size != whole]
    return not partial or all(size == 1 for size in chunk.sizes[: partial[-1]])


def source_ranges(tensor: Tensor) -> list[list[int]] | list[list[str | int]] | None:
    """``[[start, end], …]``: the stored extents as the sidecar shows them. A chunked tensor's are
    ``[[file, start, end], …]``: each chunk's archive in the file that holds it, in chunk order; a ShardedTensor's
    whole tensor's are its shards' ranges in shard order (None unless each shard's bytes are one range)."""
    if tensor.chunks is not None and all(not c.file and c.tensor is not None for c in tensor.chunks):
        shards = [source_ranges(c.tensor) for c in tensor.chunks]  # type: ignore[arg-type]
        return None if any(s is None or len(s) != 1 for s in shards) else [s[0] for s in shards]  # type: ignore
    if tensor.chunks is not None:
        return [[c.file, c.start, c.start + c.length] for c in tensor.chunks]
    extents = stored_extents(tensor)
    return None if extents is None else [[e.offset, e.offset + e.length] for e in extents]
