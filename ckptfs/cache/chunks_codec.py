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
from ckptfs.cache.layout import Sections, array, form_starts
from ckptfs.errors import CorruptCheckpointError, NoSuchObjectError, SourceError
from ckptfs.formats.dcp_tree import OVERLAP_CHECKED_CHUNKS, check_disjoint
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
    if any(not c.file for c in chunks):
        raise NotCacheable("a ShardedTensor gathered from its shards")
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
    """Gives each chunked tensor of the entry its chunks, every one checked; BadEntry otherwise. The checks of
    every box run on whole columns (a directory of 20,000 tensors has as many chunks)."""
    counts = array(sections, "tensor_chunks", len(tensors))
    chunked = np.nonzero(counts >= 0)[0]
    if not len(chunked):
        if len(array(sections, "chunk_file")):
            raise BadEntry("chunks without a chunked tensor")
        return
    total = len(array(sections, "chunk_start"))
    if not isinstance(source, SourceSet) or int(counts.min()) < -1 or int(counts.max()) > total \
            or int(counts[chunked].sum()) != total:
        raise BadEntry("chunked tensors outside a directory, or chunk counts other than the chunks")
    owner = np.repeat(chunked, counts[chunked])
    """The tensor each chunk belongs to, in chunk order."""
    files, transforms = (_strings(objs, array(sections, name, total)) for name in REFERENCE_COLUMNS)
    starts, lengths = (array(sections, name, total) for name in ("chunk_start", "chunk_length"))
    form, form_ndim = array(sections, "tensor_form", len(tensors)), array(sections, "form_ndim")
    ranks = form_ndim[form[owner]]
    dims = array(sections, "chunk_dims", 2 * int(ranks.sum()))
    _check_boxes(dims, ranks, form_starts(form_ndim)[form[owner]], array(sections, "form_dims"))
    _check_ranges(files, starts, lengths, source)
    cuts = np.cumsum(2 * ranks).tolist()
    dim_list, rank_list = dims.tolist(), ranks.tolist()
    boxes = [(tuple(dim_list[end - 2 * r : end - r]), tuple(dim_list[end - r : end]))
             for end, r in zip(cuts, rank_list)]
    chunks = list(map(Chunk, (b[0] for b in boxes), (b[1] for b in boxes), files, starts.tolist(), lengths.tolist(),
                      (tuple(t.split(SEPARATOR)) if t else () for t in transforms)))
    at = 0
    for index, count in zip(chunked.tolist(), counts[chunked].tolist()):
        tensor = tensors[index]
        tensor.chunks = chunks[at : at + count]
        at += count
        _check_tensor(tensor)


def _check_boxes(dims: np.ndarray, ranks: np.ndarray, shape_starts: np.ndarray, form_dims: np.ndarray) -> None:
    """Every box inside its tensor: ``0 <= offset``, ``0 <= size`` and ``offset + size <= dim`` for each
    dimension (``dims`` holds each chunk's offsets then sizes; ``shape_starts`` where its tensor's shape starts in
    ``form_dims``, whose bounds ``records_codec`` checked)."""
    if not len(dims):
        return
    chunk_of = np.repeat(np.arange(len(ranks)), ranks)
    within = np.arange(len(chunk_of)) - np.repeat(np.cumsum(ranks) - ranks, ranks)
    box_start = (np.cumsum(2 * ranks) - 2 * ranks)[chunk_of]
    offsets, sizes = dims[box_start + within], dims[box_start + ranks[chunk_of] + within]
    whole = form_dims[shape_starts[chunk_of] + within]
    if bool(np.any((offsets < 0) | (sizes < 0) | (offsets > whole) | (sizes > whole - offsets))):
        raise BadEntry("a chunk's box lies outside its tensor")


def _check_ranges(files: list[str], starts: np.ndarray, lengths: np.ndarray, directory: SourceSet) -> None:
    """Each chunk's blob a range of a file of the directory (within it where its size is known)."""
    if len(starts) and (int(starts.min()) < 0 or int(lengths.min()) < 0):
        raise BadEntry("a chunk at a negative offset or of negative length")
    sizes = {}
    for name in set(files):
        try:
            size = directory.member_size(name)
        except (NoSuchObjectError, SourceError):
            raise BadEntry("a chunk is stored in a file that is not in the directory") from None
        sizes[name] = -1 if size is None else size
    room = np.asarray([sizes[name] for name in files], dtype=np.int64)
    if bool(np.any((room >= 0) & ((starts > room) | (lengths > room - starts)))):
        raise BadEntry("a chunk lies past the end of its file")


def _check_tensor(tensor: Tensor) -> None:
    chunks = tensor.chunks
    assert chunks is not None
    if tensor.storage is not None or tensor.storage_offset or tensor.stride != contiguous_strides(tensor.shape):
        raise BadEntry("a chunked tensor has a storage or strides of its own")
    if sum(math.prod(c.sizes) for c in chunks) != math.prod(tensor.shape):
        raise BadEntry("a chunked tensor's boxes do not hold its elements")
    if 1 < len(chunks) <= OVERLAP_CHECKED_CHUNKS:
        try:
            check_disjoint("", chunks)  # type: ignore[arg-type]
        except CorruptCheckpointError:
            raise BadEntry("a chunked tensor's boxes overlap") from None


def _strings(objs: list[Any], refs: np.ndarray) -> list[str]:
    if len(refs) and (int(refs.min()) < 0 or int(refs.max()) >= len(objs)):
        raise BadEntry("a chunk refers outside the tables")
    values = list(map(objs.__getitem__, refs.tolist()))
    if set(map(type, values)) - {str}:
        raise BadEntry("a chunk's file or transforms are not a string")
    return values
