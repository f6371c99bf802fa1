"""The zip framing ``torch.save`` (``PyTorchStreamWriter``, miniz) gives its records, byte for byte.

Every record is stored (not deflated) and its data starts at a multiple of the
alignment, reached by an ``FB`` extra field of ``Z`` bytes after the name; the
CRC-32 and sizes follow the data in a descriptor (none for an empty record);
zip64 fields appear only for a record whose size or local-header offset needs
them, and the zip64 end records always. Names are written in the order given.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

U32 = 0xFFFFFFFF
ALIGNMENT = 64
_LOCAL = struct.Struct("<IHHHHHIIIHH")
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")
_FLAGS = 0x0808
"""Sizes and CRC in a descriptor after the data (bit 3), UTF-8 name (bit 11)."""
_EMPTY_FLAGS = 0x0800


@dataclass
class Entry:
    name: bytes
    offset: int
    """Where the local header starts."""
    size: int
    crc: int = 0


def _zip64_extra(size: int, offset: int, compressed: int) -> bytes:
    """The zip64 extra miniz writes: the sizes when the size overflows, the offset when it does; b"" if neither."""
    fields = b""
    if size >= U32:
        fields += struct.pack("<QQ", size, compressed)
    if offset >= U32:
        fields += struct.pack("<Q", offset)
    return struct.pack("<HH", 1, len(fields)) + fields if fields else b""


def local_header(entry: Entry) -> bytes:
    """The local header of ``entry`` with its padding: the record's data follows it at an aligned offset."""
    zip64 = _zip64_extra(entry.size, entry.offset, 0)
    start = entry.offset + _LOCAL.size + len(entry.name) + len(zip64) + 4
    padding = -start % ALIGNMENT
    extra = zip64 + b"FB" + struct.pack("<H", padding) + b"Z" * padding
    flags = _FLAGS if entry.size else _EMPTY_FLAGS
    return _LOCAL.pack(0x04034B50, 0, flags, 0, 0, 0, 0, 0, 0, len(entry.name), len(extra)) + entry.name + extra


def data_offset(entry: Entry) -> int:
    return entry.offset + len(local_header(entry))


def descriptor(entry: Entry) -> bytes:
    """What follows the data of a non-empty record: its CRC-32 and sizes, 64-bit where zip64 is needed."""
    if not entry.size:
        return b""
    if entry.size >= U32 or entry.offset >= U32:
        return struct.pack("<IIQQ", 0x08074B50, entry.crc, entry.size, entry.size)
    return struct.pack("<IIII", 0x08074B50, entry.crc, entry.size, entry.size)


def central_directory(entries: list[Entry], start: int) -> bytes:
    """The central directory of ``entries`` beginning at ``start``, then the zip64 end records and the classic end."""
    parts = []
    for entry in entries:
        extra = _zip64_extra(entry.size, entry.offset, entry.size)
        size32 = min(entry.size, U32)
        parts.append(_CENTRAL.pack(
            0x02014B50, 0, 0, _FLAGS if entry.size else _EMPTY_FLAGS, 0, 0, 0, entry.crc, size32, size32,
            len(entry.name), len(extra), 0, 0, 0, 0, min(entry.offset, U32)) + entry.name + extra)
    directory = b"".join(parts)
    end64 = start + len(directory)
    count = len(entries)
    parts.append(struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 0x031E, 45, 0, 0, count, count, len(directory), start))
    parts.append(struct.pack("<IIQI", 0x07064B50, 0, end64, 1))
    count16 = min(count, 0xFFFF)
    parts.append(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, count16, count16, min(len(directory), U32),
                             min(start, U32), 0))
    return b"".join(parts)
