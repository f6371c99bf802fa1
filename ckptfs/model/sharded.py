"""A ``torch.distributed._shard`` ShardedTensor's whole tensor, gathered from its local shards when they cover it.

torch.save of a ShardedTensor pickles a wrapper (dtype and global size, no
data) whose state is ``(local_shards, ShardedTensorMetadata, ...)``: each local
``Shard`` is a tensor and its ``ShardMetadata`` (``shard_offsets``,
``shard_sizes``: its box in the whole tensor). A rank's file holds only its
own shards, so the whole tensor is in the file only when those boxes lie inside
the global size and cover it without overlap (one rank, or every shard placed
on the saving rank). Then the object gains the child ``GATHERED``: a chunked
tensor (``reading.chunks``) whose chunks are the shards' tensors, read as a DCP
directory's chunks are. Otherwise it gains ``NOT_GATHERED``: why not, and the
shards stay as they were.
"""

from __future__ import annotations

import math
from typing import Any

from ckptfs.model.records import Chunk, Tensor, contiguous_strides
from ckptfs.pickle.values import PickledObject

SHARDED_TENSOR = "torch.distributed._shard.sharded_tensor.api.ShardedTensor"
SHARD = "torch.distributed._shard.sharded_tensor.shard.Shard"
SHARD_METADATA = "torch.distributed._shard.metadata.ShardMetadata"
GATHERED = "__gathered__"
"""The key of the whole tensor among the ShardedTensor's children."""
NOT_GATHERED = "__not_gathered__"
"""The key of the reason there is no whole tensor."""
OVERLAP_CHECKED_SHARDS = 256
"""Shards checked pairwise for overlaps here (more are checked as their windows are read, as DCP chunks are)."""


def with_whole_tensor(obj: PickledObject, wrapper: Tensor) -> PickledObject:
    """``obj`` (a wrapper subclass's object, ``wrapper`` its dtype and size), with its whole tensor or the
    reason it has none when it is a ShardedTensor."""
    if obj.class_name != SHARDED_TENSOR:
        return obj
    whole = _whole(obj.state, wrapper)
    obj.dict_items = [(GATHERED, whole) if isinstance(whole, Tensor) else
                      (NOT_GATHERED, f"the local shards do not make the whole tensor: {whole}")]
    return obj


def _whole(state: Any, wrapper: Tensor) -> Tensor | str:
    """The whole tensor, or why the shards do not make it."""
    shape, dtype = wrapper.shape, wrapper.dtype
    if not isinstance(state, tuple) or len(state) < 2 or not isinstance(state[0], list):
        return "the state is not (local shards, metadata, …)"
    size = _attributes(state[1]).get("size")
    if _dims(size, len(shape)) != shape:
        return f"the metadata's size {_text(size)} is not the tensor's {list(shape)}"
    if dtype.packing > 1:
        return f"{dtype.name} elements are packed"
    chunks = []
    for index, shard in enumerate(state[0]):
        chunk = _chunk(index, shard, wrapper)
        if isinstance(chunk, str):
            return chunk
        chunks.append(chunk)
    held, numel = sum(chunk.numel for chunk in chunks), math.prod(shape)
    if held != numel:
        return f"they hold {held} of its {numel} elements (the rest were on other ranks)"
    overlap = _overlap(chunks) if len(chunks) <= OVERLAP_CHECKED_SHARDS else None
    if overlap is not None:
        return overlap
    return Tensor(dtype, shape, contiguous_strides(shape), 0, None, wrapper.requires_grad, chunks=chunks)


def _chunk(index: int, shard: Any, wrapper: Tensor) -> Chunk | str:
    """The shard as a chunk of the whole tensor, or why it is not one."""
    if not isinstance(shard, PickledObject) or shard.class_name != SHARD:
        return f"local shard {index} is not a Shard"
    fields = _attributes(shard)
    tensor, metadata = fields.get("tensor"), fields.get("metadata")
    if not isinstance(tensor, Tensor) or tensor.kind != "dense" or tensor.storage is None \
            or tensor.quantization is not None:
        return f"local shard {index} holds no dense tensor"
    if not isinstance(metadata, PickledObject) or metadata.class_name != SHARD_METADATA:
        return f"local shard {index} has no ShardMetadata"
    box, rank = _attributes(metadata), len(wrapper.shape)
    offsets, sizes = _dims(box.get("shard_offsets"), rank), _dims(box.get("shard_sizes"), rank)
    if offsets is None or sizes is None:
        return (f"local shard {index}'s offsets {_text(box.get('shard_offsets'))} and sizes "
                f"{_text(box.get('shard_sizes'))} are not {rank} non-negative integers each")
    if any(o + s > d for o, s, d in zip(offsets, sizes, wrapper.shape)):
        return f"local shard {index} at {list(offsets)} of size {list(sizes)} lies outside {list(wrapper.shape)}"
    if tensor.shape != sizes or tensor.dtype is not wrapper.dtype:
        return (f"local shard {index} is a {tensor.dtype.name} tensor of size {list(tensor.shape)}, not "
                f"{wrapper.dtype.name} of size {list(sizes)}")
    return Chunk(offsets, sizes, "", 0, 0, tensor=tensor)


def _overlap(chunks: list[Chunk]) -> str | None:
    for i, a in enumerate(chunks):
        for b in chunks[:i]:
            if a.numel and b.numel and all(ao < bo + bs and bo < ao + as_ for ao, as_, bo, bs in
                                           zip(a.offsets, a.sizes, b.offsets, b.sizes)):
                return f"the shards at {list(b.offsets)} and {list(a.offsets)} overlap"
    return None


def _attributes(value: Any) -> dict[str, Any]:
    """The attribute dict of an object's state: a dict, or the slots of a ``(None, slots)`` pair."""
    state = value.state if isinstance(value, PickledObject) else None
    if isinstance(state, tuple) and len(state) == 2 and state[0] is None:
        state = state[1]
    return state if isinstance(state, dict) else {}


def _dims(value: Any, rank: int) -> tuple[int, ...] | None:
    if not isinstance(value, (list, tuple)) or len(value) != rank:
        return None
    if not all(type(v) is int and 0 <= v < 1 << 63 for v in value):
        return None
    return tuple(value)


def _text(value: Any) -> str:
    """A size from the pickle, bounded: a hostile one may be a huge list."""
    if isinstance(value, (list, tuple)) and len(value) <= 64 and all(type(v) is int and abs(v) < 1 << 63
                                                                      for v in value):
        return str(list(value))
    return f"a {type(value).__name__}"
