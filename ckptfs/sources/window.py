"""A byte range of another source seen as a source of its own: archives stored inside archives."""

from __future__ import annotations

from ckptfs.errors import SourceError
from ckptfs.sources.base import ByteSource, SourceStat


class WindowSource:
    """Bytes ``[start, start + size)`` of ``outer``, at offsets counted from ``start``.

    Parsers of an embedded archive (a torch.save blob stored in a ``.pt2``) read
    through it; the storages they find are then moved onto ``outer`` by adding
    ``start`` to their offsets, so reads and zero-copy buffers use the outer source.
    """

    def __init__(self, outer: ByteSource, start: int, size: int, name: str) -> None:
        if start < 0 or size < 0 or start + size > outer.size:
            raise SourceError(f"window of {size} bytes at offset {start} is outside the file ({outer.size} bytes)",
                              outer.name)
        self.outer = outer
        self.start = start
        self.size = size
        self.name = name

    def read(self, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise SourceError(f"read of {length} bytes at offset {offset} is outside the embedded file "
                              f"({self.size} bytes)", self.name)
        return self.outer.read(self.start + offset, length)

    def fileno(self) -> int | None:
        return None

    def stat(self) -> SourceStat | None:
        return None

    def reopen(self) -> None:
        self.outer.reopen()

    def close(self) -> None:
        """The outer source stays open: its owner closes it."""
