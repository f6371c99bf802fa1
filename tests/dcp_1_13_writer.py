"""Writes a torch 1.13 ``torch.distributed._shard.checkpoint`` directory (DCP's predecessor) with torch 2.13.

torch 2.13 keeps ``torch.distributed._shard.checkpoint`` only as an alias of
``torch.distributed.checkpoint``, so what it pickles names DCP's classes. This
writer does what 1.13's ``save_state_dict(sd, FileSystemWriter(path))`` did, as
read from the pytorch sources of the 1.13 series (``torch/distributed/_shard/
checkpoint/``: ``filesystem.py`` at fbe16fdb, ``default_planner.py`` at 05333aa9,
``planner_helpers.py`` at 945590d6), and pickles the 1.13 class names:

* the state dict is not flattened: each top-level key is one item. A tensor is
  one chunk at offsets 0 (a ShardedTensor: one chunk per local shard, its box
  the shard's metadata; here ``sharded`` cuts chosen tensors into boxes owned
  round-robin by ``world`` simulated ranks); anything else is a bytes item,
  ``torch.save(obj)`` into a BytesIO. Only sharded items are written by ranks
  other than 0 (``create_default_local_save_plan``);
* ``FileSystemWriter(path, single_file_per_rank=False)`` (1.13's default) writes
  one file per item, ``__<rank>_<n>.distcp``; with ``single_file_per_rank=True``
  one file per rank, its bytes items first, then its tensors. A tensor is
  written as ``torch.save(tensor, stream)``, cloned first when its storage is
  larger than it (``_trim``). (2.13's torch.save adds records 1.13's did not
  write, ``.format_version`` and ``.storage_alignment``; the blob is otherwise
  the same zip.)
* ``.metadata`` is ``pickle.dump(Metadata(state_dict_metadata, planner_data=None,
  storage_data={MetadataIndex: _StorageInfo}))``, Python's default protocol,
  written as ``.metadata.tmp`` and renamed. The classes: ``Metadata``,
  ``TensorStorageMetadata(properties, size, chunks)``, ``BytesStorageMetadata()``,
  ``ChunkStorageMetadata(offsets, sizes)``, ``MetadataIndex(fqn, offset, index)``
  in ``torch.distributed._shard.checkpoint.metadata``; ``_StorageInfo(relative_path,
  offset, length)`` in ``...checkpoint.filesystem``; ``TensorProperties`` is
  ``torch.distributed._shard.sharded_tensor.metadata``'s, which 2.13 still has.
"""

from __future__ import annotations

import io
import pickle
import sys
import types
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch
from dcp_writers import chunk_boxes
from torch.distributed._shard.sharded_tensor.metadata import TensorProperties

METADATA_MODULE = "torch.distributed._shard.checkpoint.metadata"
FILESYSTEM_MODULE = "torch.distributed._shard.checkpoint.filesystem"


@dataclass
class ChunkStorageMetadata:
    offsets: torch.Size
    sizes: torch.Size


@dataclass
class TensorStorageMetadata:
    properties: TensorProperties
    size: torch.Size
    chunks: list[ChunkStorageMetadata]


@dataclass
class BytesStorageMetadata:
    pass


@dataclass
class Metadata:
    state_dict_metadata: dict[str, Any]
    planner_data: Any = None
    storage_data: Any = None


@dataclass(frozen=True)
class MetadataIndex:
    fqn: str
    offset: torch.Size | None = None
    index: int | None = field(default=None, hash=False, compare=False)


@dataclass
class _StorageInfo:
    relative_path: str
    offset: int
    length: int


@contextmanager
def _under_1_13_names() -> Iterator[None]:
    """The classes above pickled under the names 1.13 gave them."""
    modules = {METADATA_MODULE: (ChunkStorageMetadata, TensorStorageMetadata, BytesStorageMetadata, Metadata,
                                 MetadataIndex), FILESYSTEM_MODULE: (_StorageInfo,)}
    saved = {name: sys.modules.get(name) for name in modules}
    try:
        for name, classes in modules.items():
            module = types.ModuleType(name)
            for cls in classes:
                cls.__module__ = name
                setattr(module, cls.__name__, cls)
            sys.modules[name] = module
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def _trim(tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.detach().cpu()
    return tensor.clone() if tensor.untyped_storage().nbytes() != tensor.nbytes else tensor


def _box(tensor: torch.Tensor, offsets: tuple[int, ...], sizes: tuple[int, ...]) -> torch.Tensor:
    for dim, (offset, size) in enumerate(zip(offsets, sizes)):
        tensor = tensor.narrow(dim, offset, size)
    return tensor


def save_1_13(state_dict: dict[str, Any], path: Path, sharded: dict[str, tuple[int, int]] | None = None,
              world: int = 1, single_file_per_rank: bool = False) -> None:
    """``state_dict`` as 1.13's ``save_state_dict`` wrote it from ``world`` ranks (see the module docstring)."""
    sharded = sharded or {}
    path.mkdir(parents=True, exist_ok=True)
    items: dict[str, Any] = {}
    storage: dict[MetadataIndex, _StorageInfo] = {}
    for rank in range(world):
        writes: list[tuple[MetadataIndex, bytes, bool]] = []
        for fqn, value in state_dict.items():
            if not isinstance(value, torch.Tensor):
                if rank == 0:
                    items[fqn] = BytesStorageMetadata()
                    blob = io.BytesIO()
                    torch.save(value, blob)
                    writes.append((MetadataIndex(fqn), blob.getvalue(), False))
                continue
            boxes = chunk_boxes(value.shape, *sharded[fqn]) if fqn in sharded else [
                ((0,) * value.dim(), tuple(value.shape))]
            for n, (offsets, sizes) in enumerate(boxes):
                if (n % world != rank) if fqn in sharded else rank != 0:
                    continue
                item = items.setdefault(fqn, TensorStorageMetadata(TensorProperties.create_from_tensor(value),
                                                                   value.size(), []))
                index = MetadataIndex(fqn, torch.Size(offsets), len(item.chunks))
                item.chunks.append(ChunkStorageMetadata(torch.Size(offsets), torch.Size(sizes)))
                blob = io.BytesIO()
                torch.save(_trim(_box(value, offsets, sizes)), blob)
                writes.append((index, blob.getvalue(), True))
        files = [[write] for write in writes] if not single_file_per_rank else [
            [w for w in writes if not w[2]] + [w for w in writes if w[2]]]
        for number, file_writes in enumerate(files):
            name, data = f"__{rank}_{number}.distcp", b""
            for index, blob, _ in file_writes:
                storage[index] = _StorageInfo(name, len(data), len(blob))
                data += blob
            (path / name).write_bytes(data)
    with _under_1_13_names():
        data = pickle.dumps(Metadata(items, storage_data=storage))
    (path / ".metadata.tmp").write_bytes(data)
    (path / ".metadata.tmp").rename(path / ".metadata")
