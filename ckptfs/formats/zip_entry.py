"""One zip record as the central directory describes it, and where its data starts once that is known."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class ZipEntry:
    name: str
    method: int
    flags: int
    compressed_size: int
    size: int
    header_offset: int
    data_offset: int = -1
    """Absolute offset of the record's (possibly compressed) data; -1 until resolved."""
    header_checked: bool = False
    """Whether ``data_offset`` was read from (or checked against) the local header."""
    crc: int = 0
    """The central directory's CRC-32 (not checked: reads are ranged)."""
    next_header: int = -1
    """Where the record after it (by header offset) starts, the central directory's offset for the last: set while
    the directory is read (-1 in an archive a metadata cache entry restored, whose data offsets are known)."""
