"""The legacy stream format (torch 0.4–1.5, ``_use_new_zipfile_serialization=False``).

Layout (spec §3.1): five pickles — magic number, protocol version, sys_info,
the object, the list of storage keys — then each storage as an int64
little-endian element count followed by its raw little-endian bytes. The
element size of each storage comes from the object pickle, so every storage
boundary is arithmetic; the file size cross-checks the sum, and each count
header is checked before its storage is first read.

The pickles come first and say nothing of their length: opening reads a
head (``FIRST_WINDOW``, which format detection has read already) and, if the
pickles go on, windows growing sixteenfold, each reading only its new bytes:
pickles of up to 4 MiB (some 30,000 tensors of a state dict) cost at most one more
read.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from ckptfs.errors import (
    CkptfsError,
    CorruptCheckpointError,
    NotACheckpointError,
    TruncatedPickleError,
    UnsupportedError,
)
from ckptfs.formats import dcp
from ckptfs.formats.interface import ParsedCheckpoint, shared_storage, storage_persistent_id
from ckptfs.formats.prefetch import Prefetch
from ckptfs.limits import Limits
from ckptfs.model import rebuild
from ckptfs.model.dtypes import dtype_of_storage_class
from ckptfs.model.records import Storage
from ckptfs.pickle.unpickler import SafeUnpickler, load_at
from ckptfs.pickle.values import PickledObject, short_repr
from ckptfs.sources import ByteSource

MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
PROTOCOL_VERSION = 1001
FIRST_WINDOW = 256 * 1024
WINDOW_GROWTH = 16
PICKLE_SNIFF_BYTES = 64 * 1024
"""A pickle without a PROTO opcode (protocols 0 and 1) is recognised by reading its first pickle this far."""
OLD_PICKLE_FIRST_OPCODES = frozenset(b"(NIJKMLFGSTUVX]})cP")
"""Opcodes of protocols 0 and 1 that can begin a pickle."""
COUNT = struct.Struct("<q")


class _LegacyStorages:
    def __init__(self, source: ByteSource) -> None:
        self.source = source
        self.storages: dict[str, Storage] = {}

    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, tuple) and pid and pid[0] == "module":
            return PickledObject(pid[1] if len(pid) > 1 else None, (), state={"source_file": pid[2:3]})
        cls, key, location, numel, view = storage_persistent_id(pid, 6)
        dtype = dtype_of_storage_class(cls.module, cls.name)
        if dtype is None:
            raise CorruptCheckpointError(f"unknown storage class {cls.qualname} for storage {key!r}")
        root = self._storage(key, dtype, location, numel)
        if view is None:
            return root
        if not (isinstance(view, tuple) and len(view) == 3 and isinstance(view[0], str)
                and all(type(v) is int and v >= 0 for v in view[1:])):
            raise CorruptCheckpointError(f"bad view metadata {short_repr(view)} for storage {key!r}")
        view_key, view_offset, view_numel = view
        if (view_offset + view_numel) * dtype.itemsize > root.nbytes:
            raise CorruptCheckpointError(f"storage view {view_key!r} runs past its root storage {key!r}")
        existing = self.storages.get(view_key)
        if existing is not None:
            return existing
        storage = Storage(view_key, dtype, location, view_numel, f"legacy:{key}", base=root, base_offset=view_offset,
                          source=self.source)
        self.storages[view_key] = storage
        return storage

    def _storage(self, key: str, dtype: Any, location: str, numel: int) -> Storage:
        known = shared_storage(self.storages, key, dtype, numel)
        if known is not None:
            return known
        storage = Storage(key, dtype, location, numel, f"legacy:{key}", source=self.source)
        self.storages[key] = storage
        return storage


def probe(opening: Prefetch, head: bytes, limits: Limits) -> bool:
    """Whether the file starts with a pickle this reader reads: protocols 2–5 by their PROTO opcode, 0 and 1 by
    reading the first pickle (a text file fails within a few bytes)."""
    if head[0] == 0x80:
        return len(head) >= 2 and head[1] <= 5
    if head[0] not in OLD_PICKLE_FIRST_OPCODES:
        return False
    window = opening.head(min(PICKLE_SNIFF_BYTES, limits.max_pickle_bytes))
    try:
        SafeUnpickler(window, persistent_load=_any_persistent_id, limits=limits).load()
    except TruncatedPickleError:
        return len(window) < opening.size
    except CkptfsError:
        return False
    return True


def _any_persistent_id(pid: Any) -> None:
    return None


def open_legacy(opening: Prefetch, limits: Limits) -> ParsedCheckpoint:
    source = opening.source
    window = min(source.size, FIRST_WINDOW, limits.max_pickle_bytes)
    while True:
        head = opening.head(window)
        try:
            return _parse(source, head, limits)
        except TruncatedPickleError:
            if window >= source.size:
                raise
            if window >= limits.max_pickle_bytes:
                raise CorruptCheckpointError(
                    f"legacy pickles exceed {limits.max_pickle_bytes} bytes (limit max_pickle_bytes)"
                ) from None
            window = min(source.size, window * WINDOW_GROWTH, limits.max_pickle_bytes)


def _parse(source: ByteSource, head: bytes, limits: Limits) -> ParsedCheckpoint:
    magic, pos = load_at(head, 0, limits=limits)
    if magic != MAGIC_NUMBER:
        if isinstance(magic, PickledObject) and magic.class_name in dcp.METADATA_CLASSES:
            raise UnsupportedError(dcp.METADATA_FILE)
        raise NotACheckpointError("a pickle file, but not a torch.save checkpoint (no legacy magic number)")
    protocol, pos = load_at(head, pos, limits=limits)
    if protocol != PROTOCOL_VERSION:
        raise UnsupportedError(f"legacy protocol version {short_repr(protocol)} (expected {PROTOCOL_VERSION})")
    sys_info, pos = load_at(head, pos, limits=limits)
    table = _LegacyStorages(source)
    root, pos = load_at(head, pos, resolve=rebuild.resolve, persistent_load=table.persistent_load, limits=limits)
    keys, pos = load_at(head, pos, limits=limits)
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise CorruptCheckpointError("legacy storage key list is not a list of strings")
    _place_storages(source, table, keys, pos)

    little = sys_info.get("little_endian") if isinstance(sys_info, dict) else None
    little = little if isinstance(little, bool) else None
    details = {"protocol_version": protocol, "writer_little_endian": little, "storage_keys": len(keys)}
    return LegacyParsed("legacy", root, list(table.storages.values()), "little", details, source=source)


@dataclass
class LegacyParsed(ParsedCheckpoint):
    source: ByteSource = field(kw_only=True)

    def verify(self, storage: Storage) -> None:
        """Checks the element count header in front of the storage's bytes against the pickle's count."""
        root = storage.base or storage
        (count,) = COUNT.unpack(self.source.read(root.offset - COUNT.size, COUNT.size))
        if count != root.numel:
            raise CorruptCheckpointError(
                f"legacy storage {root.key!r} declares {root.numel} elements in the pickle but {count} in its header"
            )


def _place_storages(source: ByteSource, table: _LegacyStorages, keys: list[str], pos: int) -> None:
    seen: set[str] = set()
    for key in keys:
        storage = table.storages.get(key)
        if storage is None:
            raise CorruptCheckpointError(f"legacy storage {key!r} is listed but no tensor names its type")
        if key in seen or storage.base is not None:
            raise CorruptCheckpointError(f"legacy storage {key!r} is listed twice or is a view")
        seen.add(key)
        storage.offset = pos + COUNT.size
        storage.size = storage.nbytes
        pos = storage.offset + storage.nbytes
    if pos != source.size:
        raise CorruptCheckpointError(f"legacy storages end at byte {pos} but the file has {source.size} bytes")
    missing = [s.key for s in table.storages.values() if s.base is None and s.key not in seen]
    if missing:
        raise CorruptCheckpointError(f"legacy storage {missing[0]!r} is referenced but not in the key list")
    for storage in table.storages.values():
        if storage.base is not None:
            storage.offset = storage.base.offset + storage.base_offset * storage.base.dtype.itemsize
            storage.size = storage.nbytes
