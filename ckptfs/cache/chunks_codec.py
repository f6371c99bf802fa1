"""The chunks of chunked tensors (a torch.distributed.checkpoint directory's items) as columns, and back, checked
as the parse checks them (``formats.dcp_directory``): each box inside its tensor, the boxes covering exactly its
elements, disjoint (for tensors of few chunks), each blob a non-negative range of a file of the directory.

A chunk's blob is parsed on its first read, as after a parse: its tensor is then checked to be the box's.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ckptfs.cache.errors import BadEntry, NotCacheable
from ckptfs.cache.layout import Sections, array
from ckptfs.errors import CorruptCheckpointError, NoSuchObjectError, SourceError
from ckptfs.formats.dcp_directory import OVERLAP_CHECKED_CHUNKS, check_disjoint
from ckptfs.model.records import Chunk, Tensor, contiguous_strides
from ckptfs.sources import SourceSet

SEPARATOR = "\0"
"""Joins a chunk's transforms into one string (a transform holding it, or empty, is not cached)."""


def encode_chunks(tensors: list[Tensor], ref: Any) -> Sections:
    """The columns of every chunk, in tensor order; ``ref`` gives a string's packed reference."""
    chunks = [c for t in tensors if t.chunks is not None for c in t.chunks]
    for tensor in tensors:
        if tensor.chunks is not None and (tensor.storage is not None or tensor.storage_offset
                                          or tensor.stride != contiguous_strides(tensor.shape)):
            raise NotCacheable("a chunked tensor with a storage or strides of its own")
    if any(SEPARATOR in t or not t for c in chunks for t in c.transforms):
        raise NotCacheable("a chunk transform that is empty or holds NUL")
    columns = {
        "tensor_chunks": [-1 if t.chunks is None else len(t.chunks) for t in tensors],
        "chunk_file": [ref(c.file) for c in chunks],
        "chunk_transforms": [ref(SEPARATOR.join(c.transforms)) for c in chunks],
        "chunk_start": [c.start for c in chunks],
        "chunk_length": [c.length for c in chunks],
        "chunk_dims": [d for c in chunks for dims in (c.offsets, c.sizes) for d in dims],
    }
    return {name: np.asarray(values, dtype=np.int64) for name, values in columns.items()}


REFERENCE_COLUMNS = ("chunk_file", "chunk_transforms")
"""Columns of packed string references, made global with the rest (``records_codec``)."""


def attach_chunks(sections: Sections, objs: list[Any], tensors: list[Tensor], source: Any) -> None:
    """Gives each chunked tensor of the entry its chunks, every one checked; BadEntry otherwise."""
    counts = array(sections, "tensor_chunks", len(tensors))
    chunked = np.nonzero(counts >= 0)[0].tolist()
    if not chunked:
        if len(array(sections, "chunk_file")):
            raise BadEntry("chunks without a chunked tensor")
        return
    if not isinstance(source, SourceSet) or int(counts.min()) < -1:
        raise BadEntry("chunked tensors outside a directory, or a bad chunk count")
    total = int(counts[counts > 0].sum())
    files, transforms = (_strings(objs, array(sections, name, total)) for name in REFERENCE_COLUMNS)
    starts, lengths = (array(sections, name, total).tolist() for name in ("chunk_start", "chunk_length"))
    if total and (min(starts) < 0 or min(lengths) < 0):
        raise BadEntry("a chunk at a negative offset or of negative length")
    ranks = [len(tensors[i].shape) for i in chunked for _ in range(int(counts[i]))]
    dims = array(sections, "chunk_dims", 2 * sum(ranks)).tolist()
    at = position = 0
    for index in chunked:
        tensor = tensors[index]
        rank, chunks = len(tensor.shape), []
        for _ in range(int(counts[index])):
            offsets, sizes = tuple(dims[position : position + rank]), tuple(dims[position + rank : position + 2 * rank])
            position += 2 * rank
            if any(o < 0 or s < 0 or o + s > n for o, s, n in zip(offsets, sizes, tensor.shape)):
                raise BadEntry("a chunk's box lies outside its tensor")
            chunks.append(Chunk(offsets, sizes, files[at], starts[at], lengths[at],
                                tuple(transforms[at].split(SEPARATOR)) if transforms[at] else ()))
            at += 1
        _check_tensor(tensor, chunks, source)
        tensor.chunks = chunks


def _check_tensor(tensor: Tensor, chunks: list[Chunk], directory: SourceSet) -> None:
    if tensor.storage is not None or tensor.storage_offset or tensor.stride != contiguous_strides(tensor.shape):
        raise BadEntry("a chunked tensor has a storage or strides of its own")
    if sum(math.prod(c.sizes) for c in chunks) != math.prod(tensor.shape):
        raise BadEntry("a chunked tensor's boxes do not hold its elements")
    if len(chunks) <= OVERLAP_CHECKED_CHUNKS:
        try:
            check_disjoint("", chunks)  # type: ignore[arg-type]
        except CorruptCheckpointError:
            raise BadEntry("a chunked tensor's boxes overlap") from None
    for chunk in chunks:
        try:
            size = directory.member_size(chunk.file)
        except (NoSuchObjectError, SourceError):
            raise BadEntry("a chunk is stored in a file that is not in the directory") from None
        if size is not None and chunk.start + chunk.length > size:
            raise BadEntry("a chunk lies past the end of its file")


def _strings(objs: list[Any], refs: np.ndarray) -> list[str]:
    if len(refs) and (int(refs.min()) < 0 or int(refs.max()) >= len(objs)):
        raise BadEntry("a chunk refers outside the tables")
    values = list(map(objs.__getitem__, refs.tolist()))
    if set(map(type, values)) - {str}:
        raise BadEntry("a chunk's file or transforms are not a string")
    return values
