"""Byte ranges of storages: ranged reads of the source, once each storage's framing is checked."""

from __future__ import annotations

import threading

from ckptfs.errors import CorruptCheckpointError
from ckptfs.formats.interface import ParsedCheckpoint
from ckptfs.model.records import Storage
from ckptfs.sources import ByteSource


class StorageReader:
    """Reads byte ranges of storages, checking each storage's framing once (thread-safe)."""

    def __init__(self, source: ByteSource, parsed: ParsedCheckpoint) -> None:
        self.source = source
        self.parsed = parsed
        self._verified: set[int] = set()
        self._lock = threading.Lock()

    def read(self, storage: Storage, offset: int, length: int) -> bytes:
        if offset < 0 or offset + length > storage.nbytes:
            raise CorruptCheckpointError(f"read past the end of storage {storage.key!r}")
        if storage.inline_data is not None:
            return storage.inline_data[offset : offset + length]
        self.verify(storage)
        if storage.compressed:
            return self.parsed.read_inflated(storage, offset, length)
        return (storage.source or self.source).read(storage.offset + offset, length)

    def verify(self, storage: Storage) -> None:
        """The format's framing check of ``storage``, the first time it is asked for."""
        if id(storage) in self._verified:
            return
        self.parsed.verify(storage)
        with self._lock:
            self._verified.add(id(storage))
