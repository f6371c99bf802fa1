"""What every container parser hands to the checkpoint model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ckptfs.errors import CorruptCheckpointError
from ckptfs.model.dtypes import DType
from ckptfs.model.records import Chunk, Storage, Tensor, replace
from ckptfs.pickle.values import Global, short_repr


@dataclass
class ParsedCheckpoint:
    """A container's parse: the object tree, its storages, and how a storage's stored bytes are reached.

    Formats whose storages need more than a ranged read of the source override
    ``verify`` (framing to check before the first read) or ``read_inflated``
    (compressed records).
    """

    format: str
    """``zip``, ``torchscript``, ``legacy``, ``tar`` or ``pt2``."""
    root: Any
    storages: list[Storage]
    byteorder: str = "little"
    details: dict[str, Any] = field(default_factory=dict)
    """Format facts worth reporting (archive prefix, versions, alignment …)."""

    def verify(self, storage: Storage) -> None:
        """Checks the storage's framing in the source once, before its bytes are first used."""

    def read_inflated(self, storage: Storage, offset: int, length: int) -> bytes:
        """``length`` bytes from ``offset`` of a compressed storage's decompressed record."""
        raise CorruptCheckpointError(f"storage {storage.key!r} is marked compressed in a {self.format} checkpoint")

    def chunk_tensor(self, chunk: Chunk, dtype_name: str) -> Tensor:
        """The tensor a chunk of a chunked tensor stores (its blob parsed once), checked to be ``dtype_name``."""
        if chunk.tensor is not None and not chunk.file:  # a ShardedTensor's shard, checked when it was made
            return chunk.tensor
        raise CorruptCheckpointError(f"a chunked tensor in a {self.format} checkpoint")


def storage_persistent_id(pid: Any, tuple_length: int) -> tuple[Global, str, str, int, Any]:
    """Validates a ``('storage', cls, key, location, numel[, view])`` persistent id."""
    if not isinstance(pid, tuple) or len(pid) != tuple_length or pid[0] != "storage":
        raise CorruptCheckpointError(f"unexpected persistent id {short_repr(pid)}")
    cls, key, location, numel = pid[1:5]
    if not isinstance(cls, Global):
        raise CorruptCheckpointError(f"storage class in persistent id is {short_repr(cls)}, not a class name")
    if not isinstance(key, str) or not key or "/" in key or "\0" in key or len(key) > 256:
        raise CorruptCheckpointError(f"bad storage key {short_repr(key)}")
    if not isinstance(location, str):
        raise CorruptCheckpointError(f"storage location {short_repr(location)} is not a string")
    if type(numel) is not int or numel < 0:
        raise CorruptCheckpointError(f"storage {key!r} has a bad element count {short_repr(numel)}")
    return cls, key, location, numel, pid[5] if tuple_length > 5 else None


def shared_storage(storages: dict[str, Storage], key: str, dtype: DType, numel: int) -> Storage | None:
    """The storage already met under ``key``, checked to have the size this reference declares.

    torch caches only storages that hold bytes, so each reference to an empty storage keeps its own
    dtype: such a reference under another dtype gets an alias of its own (a zero-byte view of the first).
    """
    known = storages.get(key)
    if known is not None and known.nbytes == 0 and numel == 0 and known.dtype is not dtype:
        alias_key = f"{key}\0{dtype.name}"
        alias = storages.get(alias_key)
        if alias is None:
            alias = replace(known, dtype=dtype, numel=0, base=known.base or known,
                                        base_offset=known.base_offset)
            storages[alias_key] = alias
        return alias
    if known is not None and known.nbytes != numel * dtype.itemsize:
        raise CorruptCheckpointError(
            f"storage {key!r} is referenced with {known.nbytes} and {numel * dtype.itemsize} bytes"
        )
    return known
