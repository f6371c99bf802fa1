"""Where a stored zip record's CRC-32 is written, and setting it.

A record's CRC is in its central directory entry and in its local framing: the data descriptor after its data
when the record's flags say so (bit 3, as ``PyTorchStreamWriter`` writes every non-empty record; the local header
then holds 0), else the local header itself. Both places are found and checked before anything is written.
"""

from __future__ import annotations

import os
import struct

from ckptfs.errors import CorruptCheckpointError
from ckptfs.formats.zip_archive import CD_HEADER, CD_SIG, LOCAL_HEADER, LOCAL_SIG, U32, ZipArchive, ZipEntry

CRC = struct.Struct("<I")
CD_CRC_AT = 16
LOCAL_CRC_AT = 14
DESCRIPTOR_SIG = b"PK\x07\x08"
HAS_DESCRIPTOR = 8


def directory_positions(archive: ZipArchive, fd: int) -> dict[str, int]:
    """Each record's central directory entry's offset in the file, by record name (the directory read again:
    the parse keeps no positions)."""
    size = os.fstat(fd).st_size
    directory = _pread(fd, size - archive.cd_offset, archive.cd_offset)
    positions: dict[str, int] = {}
    pos = 0
    while pos + CD_HEADER.size <= len(directory) and directory[pos : pos + 4] == CD_SIG:
        fields = CD_HEADER.unpack_from(directory, pos)
        name_len, extra_len, comment_len = fields[10], fields[11], fields[12]
        start = pos + CD_HEADER.size
        name = directory[start : start + name_len].decode("utf-8", "surrogateescape")
        positions.setdefault(name, archive.cd_offset + pos)
        pos = start + name_len + extra_len + comment_len
    return positions


def crc_places(entry: ZipEntry, directory_position: int | None, fd: int) -> tuple[int, int]:
    """The file offsets of the record's two CRC-32 fields (central directory, local framing), each checked to
    belong to this record; CorruptCheckpointError when either is not where the record's framing says."""
    if directory_position is None:
        raise CorruptCheckpointError(f"zip record {entry.name!r} has no central directory entry to hold its CRC")
    central = _pread(fd, CD_HEADER.size, directory_position)
    fields = CD_HEADER.unpack(central) if len(central) == CD_HEADER.size else None
    if fields is None or fields[0] != CD_SIG or fields[7] != entry.crc:
        raise CorruptCheckpointError(f"central directory entry of zip record {entry.name!r} moved")
    if not entry.flags & HAS_DESCRIPTOR:
        local = _pread(fd, LOCAL_HEADER.size, entry.header_offset)
        if len(local) != LOCAL_HEADER.size or local[:4] != LOCAL_SIG:
            raise CorruptCheckpointError(f"no local header for zip record {entry.name!r}")
        return directory_position + CD_CRC_AT, entry.header_offset + LOCAL_CRC_AT
    end = entry.data_offset + entry.compressed_size
    descriptor = _pread(fd, 24, end)
    signed = descriptor[:4] == DESCRIPTOR_SIG
    body = descriptor[4:] if signed else descriptor
    wide = entry.size >= U32 or entry.header_offset >= U32
    sizes = struct.unpack_from("<QQ" if wide else "<II", body, 4) if len(body) >= (20 if wide else 12) else None
    if sizes != (entry.compressed_size, entry.size) or CRC.unpack_from(body)[0] != entry.crc:
        raise CorruptCheckpointError(f"the data descriptor of zip record {entry.name!r} is not after its data")
    return directory_position + CD_CRC_AT, end + (4 if signed else 0)


def set_crc(fd: int, places: tuple[int, int], crc: int) -> None:
    """Writes the CRC into both places (the local one first: a reader that finds the central one set may trust
    the record)."""
    value = CRC.pack(crc)
    for place in reversed(places):
        if os.pwrite(fd, value, place) != len(value):
            raise OSError(f"short write of a CRC at offset {place}")


def _pread(fd: int, length: int, offset: int) -> bytes:
    return os.pread(fd, max(length, 0), offset)
