"""The records of a torch.distributed.checkpoint ``.metadata`` pickle, and the checks every parse path makes them
with (``dcp_metadata`` from the interpreter's value, ``dcp_columns`` from the compiled scanner's rows)."""

from __future__ import annotations

from typing import Any, NamedTuple

from ckptfs.errors import CorruptCheckpointError
from ckptfs.model.dtypes import DType
from ckptfs.pickle.values import short_repr

MAX_RANK = 64
MAX_ELEMENTS = 1 << 62

ItemKey = tuple[str, "tuple[int, ...] | None"]
"""Where an item is listed in ``storage_data``: its FQN and, for a tensor chunk, the chunk's offsets."""


class Box(NamedTuple):
    """A chunk's place in its tensor: first index and extent along each dimension."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]


class TensorItem(NamedTuple):
    dtype: DType
    size: tuple[int, ...]
    requires_grad: bool
    chunks: list[Box]


class StorageInfo(NamedTuple):
    """Where an item's bytes are: a file of the directory and a byte range in it, and how they are encoded."""

    relative_path: str
    offset: int
    length: int
    transforms: tuple[str, ...]


class DcpMetadata(NamedTuple):
    items: dict[str, TensorItem | None]
    """FQN → tensor, or None for a bytes item (a pickled object), in the writer's order."""
    planner_data: dict[str, tuple[str | int, ...]] | None
    storage: dict[ItemKey, StorageInfo]
    version: str | None
    torch_1_13: bool = False
    """Written by torch 1.13's ``torch.distributed._shard.checkpoint``."""


def corrupt(message: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(f".metadata: {message}")


def checked_box(fqn: str, size: tuple[int, ...], offsets: tuple[int, ...], sizes: tuple[int, ...]) -> Box:
    if len(offsets) != len(size) or len(sizes) != len(size):
        raise corrupt(f"chunk at {list(offsets)} of size {list(sizes)} of {fqn!r} does not have the "
                       f"{len(size)} dimensions of {list(size)}")
    if any(o + s > d for o, s, d in zip(offsets, sizes, size)):
        raise corrupt(f"chunk at {list(offsets)} of size {list(sizes)} lies outside tensor {fqn!r} "
                       f"of size {list(size)}")
    return Box(offsets, sizes)


def checked_info(path: Any, offset: Any, length: Any, transforms: Any) -> StorageInfo:
    if not isinstance(path, str) or not path or "/" in path or "\\" in path or "\0" in path or path in (".", ".."):
        raise corrupt(f"relative_path {short_repr(path)} is not a file name in the directory")
    if type(offset) is not int or type(length) is not int or offset < 0 or length < 0:
        raise corrupt(f"byte range {short_repr(offset)}+{short_repr(length)} in {path!r} is not two "
                       "non-negative integers")
    transforms = transforms or []
    if not isinstance(transforms, list) or not all(isinstance(t, str) for t in transforms):
        raise corrupt(f"transform_descriptors {short_repr(transforms)} are not a list of strings")
    return StorageInfo(path, offset, length, tuple(transforms))
