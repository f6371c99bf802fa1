"""A zip central directory's entries from the compiled scanner's rows (``cs_directory`` in
``ckptfs/pickle/_cscan_zip.c``), and the zip64 extra field of an entry the Python loop reads.

The scanner accepts only a directory ``ZipArchive`` reads without an error of its own (zip64 fields and names
other than ASCII are left to the loop); the one check left is for names met twice, made here in the loop's
order, with its message.
"""

from __future__ import annotations

import struct
from array import array

from ckptfs.errors import CorruptCheckpointError
from ckptfs.formats.zip_entry import ZipEntry
from ckptfs.pickle import cscan

U32 = 0xFFFFFFFF


def entries_from_rows(directory: bytes, rows: array[int],
                      entries: dict[str, ZipEntry]) -> tuple[list[ZipEntry], list[int]]:
    """The entries of the scanner's ``rows`` (made into ``entries`` by their names too) and their header
    offsets."""
    made: list[ZipEntry] = []
    add_entry = made.append
    for name_at, name_length, method, flags, csize, usize, offset, crc in cscan.rows(rows, cscan.DIRECTORY_FIELDS):
        name = directory[name_at : name_at + name_length].decode("ascii")
        entry = ZipEntry(name, method, flags, csize, usize, offset, -1, False, crc)
        if entries.setdefault(name, entry) is not entry:
            raise CorruptCheckpointError(f"duplicate zip record {name!r}")
        add_entry(entry)
    return made, rows[6 :: cscan.DIRECTORY_FIELDS].tolist()


def apply_zip64(extra: bytes, usize: int, csize: int, offset: int, name: str) -> tuple[int, int, int]:
    if U32 not in (usize, csize, offset):
        return usize, csize, offset
    pos = 0
    while pos + 4 <= len(extra):
        tag, length = struct.unpack_from("<HH", extra, pos)
        body = extra[pos + 4 : pos + 4 + length]
        if tag == 1:
            values = [usize, csize, offset]
            cursor = 0
            for i in range(3):
                if values[i] == U32:
                    if cursor + 8 > len(body):
                        raise CorruptCheckpointError(f"zip64 extra field of {name!r} is too short")
                    values[i] = struct.unpack_from("<Q", body, cursor)[0]
                    cursor += 8
            return values[0], values[1], values[2]
        pos += 4 + length
    raise CorruptCheckpointError(f"zip record {name!r} needs a zip64 extra field and has none")
