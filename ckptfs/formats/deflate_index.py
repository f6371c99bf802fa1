"""Random reads of a deflated zip record without inflating it whole: a seek index of decompressor checkpoints.

The first read of a record inflates it from the start only as far as needed,
keeping every ``span`` bytes of output a copy of the decompressor
(``zlib.decompressobj().copy()``: its 32 KiB window and state, about 40 KiB) with
the compressed offset it resumes from. A later read resumes from the nearest
checkpoint at or before it, so it inflates at most ``span`` bytes it does not
return. A record keeps at most ``MAX_CHECKPOINTS`` checkpoints (the span grows
for larger records) and ``DeflateIndexes`` keeps the indexes of the last few
records read, so memory stays bounded whatever the record's size. Output is
checked against the declared size: a stream that ends early, runs on or does
not inflate is a ``CorruptCheckpointError`` when the read reaches it.
"""

from __future__ import annotations

import threading
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from ckptfs.errors import CorruptCheckpointError
from ckptfs.sources import ByteSource

MIN_SPAN = 4 << 20
"""Output bytes between checkpoints: a random read inflates at most this much that it does not return."""
MAX_CHECKPOINTS = 1024
"""Per record (about 40 MiB of decompressor state at most): larger records get a longer span."""
INPUT_CHUNK = 32 << 10
"""Compressed bytes read at a time; small, as a checkpoint's decompressor keeps its unconsumed input alive."""
DISCARD_CHUNK = 1 << 20
MAX_RATIO = 1032
"""Deflate's largest expansion (258 bytes from a 2-bit code): a record declaring more is a lie."""
CACHED_INDEXES = 4


@dataclass(slots=True)
class _Checkpoint:
    out_pos: int
    in_pos: int
    """Compressed offset (relative to the record's data) of the next byte to feed."""
    state: Any
    """A ``zlib`` decompressor positioned at ``out_pos``; never used itself, only copied."""


class DeflateIndex:
    """One deflated record: its checkpoints so far and how to read any range of its inflated bytes."""

    def __init__(self, source: ByteSource, name: str, data_offset: int, compressed_size: int, size: int) -> None:
        if size > max(compressed_size, 1) * MAX_RATIO:
            raise CorruptCheckpointError(f"zip record {name!r} of {compressed_size} deflated bytes cannot inflate "
                                         f"to the {size} it declares")
        self.source = source
        self.name = name
        self.data_offset = data_offset
        self.compressed_size = compressed_size
        self.size = size
        self.span = max(MIN_SPAN, -(-size // MAX_CHECKPOINTS))
        self.checkpoints = [_Checkpoint(0, 0, zlib.decompressobj(-15))]
        self._cursor: tuple[Any, int, int, bytes] | None = None
        """Where the last read stopped (decompressor, compressed and inflated offsets, unfed input): the next
        read continues from there when it starts at or after it, as sequential reads do."""
        self._lock = threading.Lock()

    def read(self, offset: int, length: int) -> bytes:
        if offset < 0 or offset + length > self.size:
            raise CorruptCheckpointError(f"read past the end of zip record {self.name!r}")
        if length == 0:
            return b""
        with self._lock:
            start = self.checkpoints[min(offset // self.span, len(self.checkpoints) - 1)]
            cursor, self._cursor = self._cursor, None
            if cursor is not None and start.out_pos <= cursor[2] <= offset:
                inflater, in_pos, out_pos, pending = cursor
            else:
                inflater, in_pos, out_pos, pending = start.state.copy(), start.in_pos, start.out_pos, b""
        pieces: list[bytes] = []
        wanted_end = offset + length
        while out_pos < wanted_end:
            if not pending and in_pos < self.compressed_size:
                chunk = min(INPUT_CHUNK, self.compressed_size - in_pos)
                pending = self.source.read(self.data_offset + in_pos, chunk)
                in_pos += chunk
            boundary = (out_pos // self.span + 1) * self.span
            limit = min(boundary, wanted_end if out_pos >= offset else offset, out_pos + DISCARD_CHUNK) - out_pos
            try:
                data = inflater.decompress(pending, limit)
            except zlib.error as exc:
                raise CorruptCheckpointError(f"zip record {self.name!r} does not inflate: {exc}") from None
            pending = inflater.unconsumed_tail
            if (inflater.eof or not data and not pending and in_pos >= self.compressed_size) and \
                    out_pos + len(data) < self.size:
                raise CorruptCheckpointError(f"zip record {self.name!r} inflates to fewer bytes than its "
                                             f"declared {self.size}")
            if out_pos + len(data) > offset:
                pieces.append(data[max(0, offset - out_pos):])
            out_pos += len(data)
            if out_pos == boundary and out_pos < self.size:
                self._remember(out_pos, in_pos - len(pending), inflater)
        if wanted_end == self.size:
            self._check_end(inflater, pending)
        else:
            self._cursor = (inflater, in_pos, out_pos, pending)
        return b"".join(pieces)[:length]

    def _remember(self, out_pos: int, in_pos: int, inflater: Any) -> None:
        with self._lock:
            if out_pos // self.span == len(self.checkpoints):
                self.checkpoints.append(_Checkpoint(out_pos, in_pos, inflater.copy()))

    def _check_end(self, inflater: Any, pending: bytes) -> None:
        """At the declared end the stream must end too (no more output, nothing left over)."""
        try:
            extra = inflater.decompress(pending, 1)
        except zlib.error as exc:
            raise CorruptCheckpointError(f"zip record {self.name!r} does not inflate: {exc}") from None
        if extra:
            raise CorruptCheckpointError(f"zip record {self.name!r} inflates to more than its declared {self.size}")


class DeflateIndexes:
    """The seek indexes of the records read last (at most ``CACHED_INDEXES``), by record name."""

    def __init__(self) -> None:
        self._indexes: OrderedDict[str, DeflateIndex] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, name: str, make: Any) -> DeflateIndex:
        with self._lock:
            index = self._indexes.get(name)
            if index is None:
                index = self._indexes[name] = make()
                while len(self._indexes) > CACHED_INDEXES:
                    self._indexes.popitem(last=False)
            self._indexes.move_to_end(name)
            return index
