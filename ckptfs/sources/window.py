"""A byte range of another source as a source of its own: an archive stored inside a larger file (a torch.save
blob in a ``.distcp`` file or a ``.pt2``)."""

from __future__ import annotations

from ckptfs.errors import SourceError
from ckptfs.sources.base import ByteSource, SourceStat


class WindowSource:
    """Bytes ``[start, start + size)`` of ``base``, at offsets from 0. No ``fileno``: its offsets are not the file's.

    Parsers of an embedded archive read through it; the storages they find are then moved onto ``base`` by adding
    ``start`` to their offsets, so reads and zero-copy buffers use the outer source.
    """

    def __init__(self, base: ByteSource, start: int, size: int, name: str | None = None) -> None:
        if start < 0 or size < 0 or start + size > base.size:
            raise SourceError(f"range [{start}, {start + size}) is outside the file ({base.size} bytes)", base.name)
        self.base = base
        self.start = start
        self.size = size
        self.name = name or f"{base.name}[{start}:{start + size}]"

    def read(self, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise SourceError(f"read of {length} bytes at offset {offset} is outside the range "
                              f"({self.size} bytes)", self.name)
        return self.base.read(self.start + offset, length)

    def fileno(self) -> int | None:
        return None

    def stat(self) -> SourceStat | None:
        return self.base.stat()

    def reopen(self) -> None:
        """Nothing to do: the base source is reopened by its owner."""

    def close(self) -> None:
        """Nothing to do: the base source is closed by its owner."""
