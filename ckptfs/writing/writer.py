"""``TensorWriter``: positioned writes of tensors' bytes into a ``torch.save`` zip, and each record's CRC-32.

The file is opened read-write and locked (``flock``, exclusive) for as long as the writer lives: one writer per
file, whatever process it is in. Nothing beyond what torch's format holds is persisted: a record's CRC-32 is 0
while it is unwritten or being rewritten (as ``skip_data`` leaves it, which torch accepts), and set once every
byte of it has been written. Which bytes were written is known to this writer only, so a record is whole when

* this writer wrote all of its bytes (ranges kept per record), or
* it was whole when the writer opened it (its CRC set, or a file written without CRCs).

Before the first write to a record whose CRC is set, the CRC is set to 0 again, so that a writer killed
mid-write leaves a valid archive whose records are each either whole with their CRC or marked unwritten; a new
writer then treats a record marked unwritten as unwritten until all of its bytes are written again.
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
from typing import Callable, Iterable

from isal.isal_zlib import crc32

from ckptfs.errors import NotWritableError, WritePastEndError
from ckptfs.formats.zip_checkpoint import ZipParsed
from ckptfs.model.records import Storage, Tensor, path_of
from ckptfs.write_back import WriteBack
from ckptfs.writing.targets import Target, Targets
from ckptfs.writing.zip_crc import crc_places, directory_positions, set_crc

CRC_READ = 16 << 20
"""Bytes read at a time to compute a record's CRC-32 from the file."""


class _Record:
    """What this writer knows of one storage record."""

    __slots__ = ("storage", "places", "ranges", "crc", "crc_end", "was_whole", "crc_set", "pending", "writing",
                 "lock")

    def __init__(self, storage: Storage, places: tuple[int, int], crc: int) -> None:
        self.storage = storage
        self.places = places
        self.ranges: list[tuple[int, int]] = []
        """Byte ranges of the record written by this writer, sorted and merged."""
        self.crc = 0
        self.crc_end = 0
        """The CRC-32 of bytes ``[0, crc_end)`` as they were written in order (-1: written out of order)."""
        self.was_whole = storage.written
        self.crc_set = crc != 0
        """The record's CRC in the file is not 0."""
        self.pending = False
        """Written since its CRC was last set."""
        self.writing = 0
        """Writes under way."""
        self.lock = threading.Lock()
        """Guards the fields above and the record's CRC in the file (each record its own: writers of different
        records do not wait for each other's CRC work)."""

    def add(self, start: int, data: memoryview) -> None:
        end = start + len(data)
        merged: list[tuple[int, int]] = []
        for a, b in self.ranges:
            if b < start or a > end:
                merged.append((a, b))
            else:
                start, end = min(a, start), max(b, end)
        merged.append((start, end))
        merged.sort()
        self.ranges = merged

    def whole(self) -> bool:
        return self.was_whole or self.ranges == [(0, self.storage.nbytes)]


class TensorWriter:
    """Writes tensors' bytes in place into the local zip at ``path``, which ``parsed`` is the parse of."""

    def __init__(self, path: str, parsed: ZipParsed, tensors: list[Tensor],
                 verify: Callable[[Storage], None]) -> None:
        self.path = path
        self._archive = parsed.archive
        self._verify = verify
        self._targets = Targets(tensors)
        self._records: dict[int, _Record] = {}
        self._positions: dict[str, int] | None = None
        self._lock = threading.Lock()
        try:
            self._fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as exc:
            raise NotWritableError(f"cannot open for writing: {exc.strerror}", path) from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self._fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise NotWritableError("already open for writing (by a -o rw mount or ckptfs.open(mode='r+'))",
                                       path) from None
            raise NotWritableError(f"cannot lock for writing: {exc.strerror}", path) from None
        self._write_back = WriteBack(self._fd)

    def target(self, tensor: Tensor) -> Target:
        """Where the tensor's bytes are written; NotWritableError saying why it is read-only."""
        found = self._targets.of(tensor)
        if isinstance(found, str):
            raise NotWritableError(f"tensor {_name(tensor)} is read-only: {found}", self.path)
        return found

    def writable(self, tensor: Tensor) -> bool:
        return not isinstance(self._targets.of(tensor), str)

    def write(self, tensor: Tensor, data: bytes | bytearray | memoryview, offset: int = 0) -> int:
        """Writes ``data`` at byte ``offset`` of the tensor's logical bytes; all of it, or (past the tensor's
        end: WritePastEndError) none of it. Thread-safe."""
        target = self.target(tensor)
        view = memoryview(data).cast("B")
        if offset < 0 or offset + len(view) > target.length:
            raise WritePastEndError(f"a write of {len(view)} bytes at offset {offset} runs past the end of tensor "
                                    f"{_name(tensor)} ({target.length} bytes)", self.path)
        if not view:
            return 0
        record = self._record(target.storage)
        start = target.start + offset
        with record.lock:
            if record.crc_set:
                set_crc(self._fd, record.places, 0)
                self._forget_crc(record)
            record.writing += 1
        try:
            _pwrite_all(self._fd, view, target.storage.offset + start)
            self._write_back.written(target.storage.offset + start, len(view))
        finally:
            with record.lock:
                record.writing -= 1
                if start == record.crc_end:
                    record.crc = crc32(view, record.crc)
                    record.crc_end += len(view)
                elif start < record.crc_end:
                    record.crc_end = -1
                record.add(start, view)
                record.pending = True
        return len(view)

    def finish(self, storages: Iterable[Storage] | None = None) -> list[Storage]:
        """Sets the CRC-32 of each whole record written since its CRC was last set (of ``storages``, or all);
        returns their storages. Records with writes under way are left for a later call."""
        with self._lock:
            records = list(self._records.values()) if storages is None else [
                record for storage in storages if (record := self._records.get(id(storage))) is not None]
        finished = []
        for record in records:
            with record.lock:
                if not record.pending or record.writing or not record.whole():
                    continue
                crc = record.crc if record.crc_end == record.storage.nbytes else self._crc_of(record.storage)
                set_crc(self._fd, record.places, crc)
                entry = self._archive.entries[self._archive.prefix + record.storage.record]
                entry.crc = crc
                record.crc_set, record.pending, record.was_whole = crc != 0, False, True
                record.storage.written = True
                finished.append(record.storage)
        return finished

    def sync(self) -> list[Storage]:
        """``finish``, then the file's data and CRCs to the disk."""
        finished = self.finish()
        os.fsync(self._fd)
        return finished

    def close(self) -> None:
        """Finishes and syncs; the lock goes with the last descriptor (a forked daemon keeps its copy)."""
        if self._fd < 0:
            return
        try:
            self.sync()
        finally:
            self._write_back.close()
            os.close(self._fd)
            self._fd = -1

    def _record(self, storage: Storage) -> _Record:
        record = self._records.get(id(storage))
        if record is not None:
            return record
        with self._lock:
            record = self._records.get(id(storage))
            if record is None:
                try:
                    self._verify(storage)
                    if self._positions is None:
                        self._positions = directory_positions(self._archive, self._fd)
                    entry = self._archive.entries[self._archive.prefix + storage.record]
                    places = crc_places(entry, self._positions.get(entry.name), self._fd)
                except Exception as exc:
                    reason = getattr(exc, "reason", str(exc))
                    raise NotWritableError(f"record {storage.record!r} cannot be written: {reason}",
                                           self.path) from None
                record = self._records[id(storage)] = _Record(storage, places, entry.crc)
        return record

    def _forget_crc(self, record: _Record) -> None:
        """The record's CRC set to 0 in the file is what it is now: being written (its bytes stay whole if they
        were)."""
        record.crc_set = False
        self._archive.entries[self._archive.prefix + record.storage.record].crc = 0
        record.storage.written = False

    def _crc_of(self, storage: Storage) -> int:
        crc = 0
        for start in range(0, storage.nbytes, CRC_READ):
            length = min(CRC_READ, storage.nbytes - start)
            chunk = os.pread(self._fd, length, storage.offset + start)
            if len(chunk) != length:
                raise NotWritableError(f"record {storage.record!r} is cut short", self.path)
            crc = crc32(chunk, crc)
        return crc


def _pwrite_all(fd: int, view: memoryview, position: int) -> None:
    while view:
        done = os.pwrite(fd, view, position)
        view, position = view[done:], position + done


def _name(tensor: Tensor) -> str:
    return ".".join(map(str, path_of(tensor.trail))) or "(root)"
