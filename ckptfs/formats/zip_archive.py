"""A lazy reader of ZIP containers as written by torch's PyTorchStreamWriter.

Opening reads the tail (end records and central directory) in one or two
ranged reads. Small records are fetched in merged spans; storage data offsets
are predicted with torch's alignment rule (spec §1.6) and verified against one
local header, falling back to reading local headers for archives other tools
re-zipped.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from ckptfs.errors import (
    CkptfsError,
    CorruptCheckpointError,
    LimitExceededError,
    NotACheckpointError,
    UnsupportedError,
)
from ckptfs.limits import Limits
from ckptfs.sources import ByteSource

U32 = 0xFFFFFFFF
U16 = 0xFFFF
EOCD_SIG = b"PK\x05\x06"
ZIP64_LOCATOR_SIG = b"PK\x06\x07"
ZIP64_EOCD_SIG = b"PK\x06\x06"
CD_SIG = b"PK\x01\x02"
LOCAL_SIG = b"PK\x03\x04"
LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")
CD_HEADER = struct.Struct("<4sHHHHHHIIIHHHHHII")
EOCD = struct.Struct("<4sHHHHIIH")
ZIP64_EOCD = struct.Struct("<4sQHHIIQQQQ")
ZIP64_LOCATOR = struct.Struct("<4sIQI")
TAIL_READ = 128 * 1024
MERGE_GAP = 64 * 1024
STORED = 0
DEFLATED = 8
NOT_A_CHECKPOINT = "a zip archive, but not a torch.save checkpoint (no data.pkl)"


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
    crc: int = 0
    """The central directory's CRC-32 (not checked: reads are ranged)."""


class ZipArchive:
    def __init__(self, source: ByteSource, limits: Limits = Limits()) -> None:
        self.source = source
        self.limits = limits
        self.entries: dict[str, ZipEntry] = {}
        self._read_directory()
        self._by_offset = sorted(self.entries.values(), key=lambda e: e.header_offset)
        self._next_header = {
            e.name: (self._by_offset[i + 1].header_offset if i + 1 < len(self._by_offset) else self.cd_offset)
            for i, e in enumerate(self._by_offset)
        }
        self.prefix = self._find_prefix()

    # -- central directory -----------------------------------------------------

    def _read_directory(self) -> None:
        size = self.source.size
        if size < EOCD.size:
            raise CorruptCheckpointError("zip file too short for an end-of-central-directory record")
        tail_start = max(0, size - TAIL_READ)
        tail = self.source.read(tail_start, size - tail_start)
        self._tail, self._tail_start = tail, tail_start
        eocd_pos = self._find_eocd(tail)
        (_, disk, cd_disk, _, count, cd_size, cd_offset, _) = EOCD.unpack_from(tail, eocd_pos)
        if disk != 0 or cd_disk != 0:
            raise UnsupportedError("multi-disk zip archives are not supported")
        end_of_cd = tail_start + eocd_pos
        locator_pos = eocd_pos - ZIP64_LOCATOR.size
        if locator_pos >= 0 and tail[locator_pos : locator_pos + 4] == ZIP64_LOCATOR_SIG:
            _, _, z64_offset, _ = ZIP64_LOCATOR.unpack_from(tail, locator_pos)
            if z64_offset + ZIP64_EOCD.size > tail_start + locator_pos:
                raise CorruptCheckpointError(f"zip64 end record offset {z64_offset} is past its locator")
            record = self._bytes_at(z64_offset, ZIP64_EOCD.size)
            fields = ZIP64_EOCD.unpack(record)
            if fields[0] != ZIP64_EOCD_SIG:
                raise CorruptCheckpointError(f"no zip64 end-of-central-directory record at offset {z64_offset}")
            count, cd_size, cd_offset = fields[7], fields[8], fields[9]
            end_of_cd = z64_offset
        if count > self.limits.max_zip_entries:
            raise LimitExceededError(f"zip has {count} entries (limit max_zip_entries={self.limits.max_zip_entries})")
        if cd_offset + cd_size > end_of_cd:
            raise CorruptCheckpointError(
                f"central directory ({cd_size} bytes at offset {cd_offset}) overruns the end records at {end_of_cd}"
            )
        self.cd_offset = cd_offset
        directory = self._bytes_at(cd_offset, cd_size)
        self._parse_directory(directory, count)

    @staticmethod
    def _find_eocd(tail: bytes) -> int:
        pos = len(tail)
        while True:
            pos = tail.rfind(EOCD_SIG, 0, pos)
            if pos < 0:
                raise CorruptCheckpointError("no zip end-of-central-directory record")
            if pos + EOCD.size <= len(tail):
                comment_length = struct.unpack_from("<H", tail, pos + 20)[0]
                if pos + EOCD.size + comment_length == len(tail):
                    return pos

    def _bytes_at(self, offset: int, length: int) -> bytes:
        """Bytes of the source, from the tail already read when they lie in it."""
        start = offset - self._tail_start
        if start >= 0 and start + length <= len(self._tail):
            return self._tail[start : start + length]
        return self.source.read(offset, length)

    def _parse_directory(self, directory: bytes, count: int) -> None:
        pos = 0
        for _ in range(count):
            if pos + CD_HEADER.size > len(directory):
                raise CorruptCheckpointError("central directory is truncated")
            (sig, _, _, flags, method, _, _, crc, csize, usize, name_len, extra_len, comment_len,
             _, _, _, offset) = CD_HEADER.unpack_from(directory, pos)
            if sig != CD_SIG:
                raise CorruptCheckpointError(f"bad central directory entry signature at entry offset {pos}")
            start = pos + CD_HEADER.size
            end = start + name_len + extra_len + comment_len
            if end > len(directory):
                raise CorruptCheckpointError("central directory entry runs past the directory")
            name = directory[start : start + name_len].decode("utf-8", "surrogateescape")
            extra = directory[start + name_len : start + name_len + extra_len]
            usize, csize, offset = _apply_zip64(extra, usize, csize, offset, name)
            if flags & 1:
                raise UnsupportedError(f"zip record {name!r} is encrypted")
            if method == STORED and csize != usize:
                raise CorruptCheckpointError(f"stored zip record {name!r} has {csize} bytes but claims {usize}")
            if name in self.entries:
                raise CorruptCheckpointError(f"duplicate zip record {name!r}")
            if offset + LOCAL_HEADER.size + csize > self.cd_offset:
                raise CorruptCheckpointError(
                    f"zip record {name!r} ({csize} bytes at offset {offset}) overruns the central directory"
                )
            self.entries[name] = ZipEntry(name, method, flags, csize, usize, offset, crc=crc)
            pos = end
        if pos != len(directory):
            raise CorruptCheckpointError(
                f"central directory holds {len(directory) - pos} bytes beyond its {count} entries"
            )

    def _find_prefix(self) -> str:
        if not self.entries:
            raise CorruptCheckpointError("zip archive has no records")
        first = next(iter(self.entries))
        slash = first.find("/")
        if slash <= 0:
            raise self._prefix_error(f"zip record {first!r} is not inside an archive directory")
        prefix = first[: slash + 1]
        stray = [n for n in self.entries if not n.startswith(prefix)]
        if stray:
            raise self._prefix_error(f"zip record {stray[0]!r} is outside the archive directory {prefix!r}")
        return prefix

    def _prefix_error(self, message: str) -> CkptfsError:
        """A torch.save archive holds ``<archive>/data.pkl``: a zip without any data.pkl is not one at all."""
        if any(name == "data.pkl" or (name.endswith("/data.pkl") and name.count("/") == 1) for name in self.entries):
            return CorruptCheckpointError(message)
        return NotACheckpointError(NOT_A_CHECKPOINT)

    # -- records -----------------------------------------------------------------

    def entry(self, record: str) -> ZipEntry | None:
        return self.entries.get(self.prefix + record)

    def read_records(self, max_sizes: dict[str, int]) -> dict[str, bytes]:
        """Contents of the named records that exist (names below the prefix), fetched in merged spans.

        ``max_sizes`` maps each name to the largest size accepted for it.
        """
        wanted = sorted((e for r in max_sizes if (e := self.entry(r)) is not None), key=lambda e: e.header_offset)
        result: dict[str, bytes] = {}
        groups: list[list[ZipEntry]] = []
        for e in wanted:
            limit = max_sizes[e.name[len(self.prefix) :]]
            if e.size > limit:
                raise LimitExceededError(f"zip record {e.name!r} of {e.size} bytes exceeds the limit of {limit}")
            if groups and e.header_offset - self._span_end(groups[-1][-1]) < MERGE_GAP:
                groups[-1].append(e)
            else:
                groups.append([e])
        for group in groups:
            start = group[0].header_offset
            buffer = self._bytes_at(start, self._span_end(group[-1]) - start)
            for e in group:
                data_start = self._local_data_offset(buffer, e.header_offset - start, e) - start
                e.data_offset = start + data_start
                if e.data_offset + e.compressed_size > self._next_header[e.name]:
                    raise CorruptCheckpointError(f"zip record {e.name!r} overlaps the next record")
                raw = buffer[data_start : data_start + e.compressed_size]
                if len(raw) != e.compressed_size:
                    raise CorruptCheckpointError(f"zip record {e.name!r} runs past the next record")
                result[e.name[len(self.prefix) :]] = self._decode(e, raw)
        return result

    def _span_end(self, e: ZipEntry) -> int:
        worst = e.header_offset + LOCAL_HEADER.size + 2 * U16 + e.compressed_size
        return min(self._next_header[e.name], worst)

    def _local_data_offset(self, buffer: bytes, pos: int, e: ZipEntry) -> int:
        """Absolute data offset of ``e`` from its local header at ``buffer[pos:]``."""
        if pos + LOCAL_HEADER.size > len(buffer):
            raise CorruptCheckpointError(f"local header of zip record {e.name!r} is truncated")
        fields = LOCAL_HEADER.unpack_from(buffer, pos)
        if fields[0] != LOCAL_SIG:
            raise CorruptCheckpointError(f"no local header at offset {e.header_offset} for zip record {e.name!r}")
        name_len, extra_len = fields[9], fields[10]
        data = e.header_offset + LOCAL_HEADER.size + name_len + extra_len
        if data + e.compressed_size > self.cd_offset:
            raise CorruptCheckpointError(f"zip record {e.name!r} overruns the central directory")
        return data

    def _decode(self, e: ZipEntry, raw: bytes) -> bytes:
        if e.method == STORED:
            return raw
        if e.method == DEFLATED:
            inflater = zlib.decompressobj(-15)
            try:
                data = inflater.decompress(raw, e.size)
            except zlib.error as exc:
                raise CorruptCheckpointError(f"zip record {e.name!r} does not inflate: {exc}") from None
            if len(data) != e.size or inflater.unconsumed_tail:
                raise CorruptCheckpointError(f"zip record {e.name!r} inflates to a size other than {e.size} bytes")
            return data
        raise UnsupportedError(f"zip record {e.name!r} uses compression method {e.method}")

    def resolve_data_offsets(self, entries: list[ZipEntry], alignment: int | None) -> None:
        """Sets ``data_offset`` of each entry, by torch's alignment rule where it verifiably holds."""
        pending = [e for e in entries if e.data_offset < 0]
        if not pending:
            return
        if alignment is not None and self._alignment_rule_holds(pending[0], alignment):
            for e in pending:
                e.data_offset = predicted_data_offset(e.header_offset, len(e.name.encode("utf-8", "surrogateescape")),
                                                      e.size, alignment)
                if e.data_offset + e.compressed_size > self._next_header[e.name]:
                    raise CorruptCheckpointError(f"zip record {e.name!r} overlaps the next record")
            return
        for e in pending:
            header = self.source.read(e.header_offset, LOCAL_HEADER.size)
            e.data_offset = self._local_data_offset(header, 0, e)
            if e.data_offset + e.compressed_size > self._next_header[e.name]:
                raise CorruptCheckpointError(f"zip record {e.name!r} overlaps the next record")

    def _alignment_rule_holds(self, e: ZipEntry, alignment: int) -> bool:
        name_len = len(e.name.encode("utf-8", "surrogateescape"))
        predicted = predicted_data_offset(e.header_offset, name_len, e.size, alignment)
        header_len = predicted - e.header_offset
        if header_len > LOCAL_HEADER.size + name_len + U16:
            return False
        header = self.source.read(e.header_offset, header_len)
        try:
            actual = self._local_data_offset(header, 0, e)
        except CorruptCheckpointError:
            return False
        extra = header[LOCAL_HEADER.size + name_len :]
        return actual == predicted and (extra[:2] == b"FB" or extra[:2] == b"\x01\x00")


def check_inflation(entry: ZipEntry, limits: Limits) -> None:
    """Refuses a deflated pickle or code record claiming more than ``max_pickle_inflation`` × its size (+1 MiB)."""
    allowed = limits.max_pickle_inflation * entry.compressed_size + (1 << 20)
    if entry.method == DEFLATED and entry.size > allowed:
        raise LimitExceededError(f"deflated record {entry.name!r} of {entry.compressed_size} bytes claims "
                                 f"{entry.size} bytes, more than {limits.max_pickle_inflation}x "
                                 f"(limit max_pickle_inflation)")


def predicted_data_offset(header_offset: int, name_len: int, size: int, alignment: int) -> int:
    """Where PyTorchStreamWriter puts a record's data (spec §1.6)."""
    start = header_offset + LOCAL_HEADER.size + name_len + 4
    if size >= U32 or header_offset >= U32:
        start += 4
        if size >= U32:
            start += 16
        if header_offset >= U32:
            start += 8
    return start + (alignment - start % alignment) % alignment


def _apply_zip64(extra: bytes, usize: int, csize: int, offset: int, name: str) -> tuple[int, int, int]:
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
