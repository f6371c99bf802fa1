"""A lazy reader of ZIP containers as written by torch's PyTorchStreamWriter.

Opening reads the tail (end records and central directory; a second read only
for the part of a directory larger than the tail) and the pickles and small
records in merged spans: two reads for a torch.save archive of any data size.
Storage data offsets are computed with torch's alignment rule (spec §1.6),
never by reading local headers, for every record whose place in the central
directory shows torch's layout: its local header, padded to the alignment, and
its data fill the space up to the next record exactly. Other records (archives
other tools re-zipped) have their local header read at open. Each computed
offset is checked against its local header before the record's bytes are first
used (``check_local_header``), so a header that disagrees is an error, never
wrong bytes.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping

from ckptfs.errors import (
    CkptfsError,
    CorruptCheckpointError,
    LimitExceededError,
    NotACheckpointError,
    UnsupportedError,
)
from ckptfs.formats.prefetch import Prefetch
from ckptfs.formats.zip_directory import U32, apply_zip64, entries_from_rows
from ckptfs.formats.zip_entry import ZipEntry
from ckptfs.formats.zip_records import ZipRecords
from ckptfs.limits import Limits
from ckptfs.pickle import cscan
from ckptfs.sources import ByteSource

U16 = 0xFFFF
EOCD_SIG = b"PK\x05\x06"
ZIP64_LOCATOR_SIG = b"PK\x06\x07"
ZIP64_EOCD_SIG = b"PK\x06\x06"
CD_SIG = b"PK\x01\x02"
LOCAL_SIG = b"PK\x03\x04"
LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")
CD_HEADER = struct.Struct("<4sHHHHHHIIIHHHHHII")
CD_FIELDS = struct.Struct("<4s4xHH4xIIIHHH8xI")
"""The fields of ``CD_HEADER`` a reader uses: signature, flags, method, CRC-32, sizes, name/extra/comment lengths
and the local header's offset."""
EOCD = struct.Struct("<4sHHHHIIH")
ZIP64_EOCD = struct.Struct("<4sQHHIIQQQQ")
ZIP64_LOCATOR = struct.Struct("<4sIQI")
MERGE_GAP = 64 * 1024
TRUNCATED = ": the file looks truncated (a copy cut short, or a save still being written)"
"""A zip's directory is written last: without its end record the file stopped before its end."""
DESCRIPTOR_SIZES = (12, 16, 20, 24)
"""A data descriptor: CRC and 4- or 8-byte sizes, with or without its signature (torch writes one after each
record)."""
BEFORE_DIRECTORY = 4096
"""Read with the central directory when the tail misses them: torch puts its ``version`` records (and
TorchScript its pickles) just before the directory."""
STORED = 0
DEFLATED = 8
NOT_A_CHECKPOINT = "a zip archive, but not a torch.save checkpoint (no data.pkl)"


class ZipArchive:
    def __init__(self, opening: Prefetch, limits: Limits = Limits()) -> None:
        self.source = opening.source
        self.limits = limits
        self._opening: Prefetch | None = opening
        self.entries: Mapping[str, ZipEntry] = {}
        """Every record by its name: a ``ZipRecords`` where the compiled scanner read the directory, else a dict (a
        ``StoredRecords`` once a checkpoint's storages are known)."""
        self._read_directory()
        self.prefix = self._find_prefix()

    @classmethod
    def restored(cls, source: ByteSource, limits: Limits, prefix: str, cd_offset: int,
                 entries: Mapping[str, ZipEntry]) -> ZipArchive:
        """The archive as a metadata cache entry remembers it: the storage records, each with its data offset
        (``entries`` may make them on first use); every local header is still checked before first use."""
        archive = cls.__new__(cls)
        archive.source, archive.limits, archive._opening = source, limits, None
        archive.entries, archive.prefix, archive.cd_offset = entries, prefix, cd_offset
        return archive

    # -- central directory -----------------------------------------------------

    def _read_directory(self) -> None:
        opening = self._reads()
        if self.source.size < EOCD.size:
            raise CorruptCheckpointError(f"zip file too short for an end-of-central-directory record{TRUNCATED}")
        tail, tail_start = opening.tail, opening.tail_start
        eocd_pos = find_end_record(tail)
        if eocd_pos < 0:
            raise CorruptCheckpointError(f"no zip end-of-central-directory record{TRUNCATED}")
        (_, disk, cd_disk, _, count, cd_size, cd_offset, _) = EOCD.unpack_from(tail, eocd_pos)
        if disk != 0 or cd_disk != 0:
            raise UnsupportedError("multi-disk zip archives are not supported")
        end_of_cd = tail_start + eocd_pos
        locator_pos = eocd_pos - ZIP64_LOCATOR.size
        if locator_pos >= 0 and tail[locator_pos : locator_pos + 4] == ZIP64_LOCATOR_SIG:
            _, _, z64_offset, _ = ZIP64_LOCATOR.unpack_from(tail, locator_pos)
            if z64_offset + ZIP64_EOCD.size > tail_start + locator_pos:
                raise CorruptCheckpointError(f"zip64 end record offset {z64_offset} is past its locator")
            record = opening.read(z64_offset, ZIP64_EOCD.size)
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
        before = min(cd_offset, BEFORE_DIRECTORY)
        if not opening.covers(cd_offset - before, cd_size + before):
            opening.read(cd_offset - before, cd_size + before)
        self._parse_directory(opening.read(cd_offset, cd_size), count)

    def _reads(self) -> Prefetch:
        assert self._opening is not None, "records and the directory are read while opening"
        return self._opening

    def finish_opening(self) -> None:
        """Drops the bytes read while opening; later reads go to the source."""
        self._opening = None

    def _parse_directory(self, directory: bytes, count: int) -> None:
        directory = bytes(directory)  # the same object when it is bytes already: names are sliced from it
        scanned = cscan.directory(directory, count, self.cd_offset)
        if scanned is None:
            made, offsets, in_order = self._parse_entries(directory, count)
        else:
            rows, in_order = scanned
            numbers = cscan.directory_keys(directory, rows, count) if in_order else None
            if numbers is not None:
                self.entries = ZipRecords(directory, rows, numbers, self.cd_offset)
                return
            entries: dict[str, ZipEntry] = {}
            made, offsets = entries_from_rows(directory, rows, entries)
            self.entries = entries
        if not in_order:
            order = sorted(range(len(offsets)), key=offsets.__getitem__)
            made = [made[i] for i in order]
            offsets = [offsets[i] for i in order]
        offsets.append(self.cd_offset)
        for entry, following in zip(made, offsets[1:]):
            entry.next_header = following

    def _parse_entries(self, directory: bytes, count: int) -> tuple[list[ZipEntry], list[int], bool]:
        # One pass with local bindings and a Struct of the used fields only: ~200,000 records for a large MoE.
        entries: dict[str, ZipEntry] = {}
        self.entries = entries
        size = len(directory)
        unpack = CD_FIELDS.unpack_from
        header_size = CD_HEADER.size
        local_size = LOCAL_HEADER.size
        cd_offset = self.cd_offset
        make_entry = ZipEntry
        made: list[ZipEntry] = []
        offsets: list[int] = []
        add_entry, add_offset = made.append, offsets.append
        in_order = True
        last_offset = -1
        pos = 0
        for _ in range(count):
            start = pos + header_size
            if start > size:
                raise CorruptCheckpointError("central directory is truncated")
            sig, flags, method, crc, csize, usize, name_len, extra_len, comment_len, offset = unpack(directory, pos)
            if sig != CD_SIG:
                raise CorruptCheckpointError(f"bad central directory entry signature at entry offset {pos}")
            pos = start + name_len + extra_len + comment_len
            if pos > size:
                raise CorruptCheckpointError("central directory entry runs past the directory")
            name = directory[start : start + name_len].decode("utf-8", "surrogateescape")
            if usize == U32 or csize == U32 or offset == U32:
                extra = directory[start + name_len : start + name_len + extra_len]
                usize, csize, offset = apply_zip64(extra, usize, csize, offset, name)
            if flags & 1:
                raise UnsupportedError(f"zip record {name!r} is encrypted")
            if method == STORED and csize != usize:
                raise CorruptCheckpointError(f"stored zip record {name!r} has {csize} bytes but claims {usize}")
            entry = make_entry(name, method, flags, csize, usize, offset, -1, False, crc)
            if entries.setdefault(name, entry) is not entry:
                raise CorruptCheckpointError(f"duplicate zip record {name!r}")
            if offset + local_size + csize > cd_offset:
                raise CorruptCheckpointError(
                    f"zip record {name!r} ({csize} bytes at offset {offset}) overruns the central directory"
                )
            add_entry(entry)
            add_offset(offset)
            if offset <= last_offset:
                in_order = False
            last_offset = offset
        if pos != size:
            raise CorruptCheckpointError(f"central directory holds {size - pos} bytes beyond its {count} entries")
        return made, offsets, in_order

    def _find_prefix(self) -> str:
        if not self.entries:
            raise CorruptCheckpointError("zip archive has no records")
        first = next(iter(self.entries))
        slash = first.find("/")
        if slash <= 0:
            raise self._prefix_error(f"zip record {first!r} is not inside an archive directory")
        prefix = first[: slash + 1]
        # (A numbered record's name starts with the first name's prefix.)
        names = self.entries.unnumbered() if isinstance(self.entries, ZipRecords) else self.entries
        stray = [n for n in names if not n.startswith(prefix)]
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
                # Records other than the pickles are small by nature: a limit of their own is no setting.
                named = " (limit max_pickle_bytes)" if limit == self.limits.max_pickle_bytes else ""
                raise LimitExceededError(f"zip record {e.name!r} of {e.size} bytes exceeds the limit of {limit}{named}")
            if groups and e.header_offset - self._span_end(groups[-1][-1]) < MERGE_GAP:
                groups[-1].append(e)
            else:
                groups.append([e])
        opening = self._reads()
        for group in groups:
            start = group[0].header_offset
            end = self._span_end(group[-1])
            if not opening.covers(start, end - start):
                # Reading on up to bytes already read costs no extra read and holds the records between
                # (a TorchScript archive's code records, read next, lie between its pickles and the tail).
                opening.read(start, (opening.known_start_after(end, MERGE_GAP) or end) - start)
            buffer = opening.read(start, end - start)
            for e in group:
                data_start = self._local_data_offset(buffer, e.header_offset - start, e) - start
                e.data_offset = start + data_start
                if e.data_offset + e.compressed_size > e.next_header:
                    raise CorruptCheckpointError(f"zip record {e.name!r} overlaps the next record")
                raw = buffer[data_start : data_start + e.compressed_size]
                if len(raw) != e.compressed_size:
                    raise CorruptCheckpointError(f"zip record {e.name!r} runs past the next record")
                result[e.name[len(self.prefix) :]] = self._decode(e, raw)
        return result

    def _span_end(self, e: ZipEntry) -> int:
        worst = e.header_offset + LOCAL_HEADER.size + 2 * U16 + e.compressed_size
        return min(e.next_header, worst)

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
        """Sets ``data_offset`` of each entry: computed where the directory shows torch's layout, else read from
        its local header (one read each)."""
        # One loop with torch's rule inlined for the common case (offsets and sizes below 4 GiB): it runs once
        # per storage, ~200,000 times for a large MoE.
        fixed = LOCAL_HEADER.size + 4
        for e in entries:
            if e.data_offset >= 0:
                continue
            name = e.name
            computed = None
            if alignment is not None:
                header_offset, size, csize = e.header_offset, e.size, e.compressed_size
                name_len = len(name) if name.isascii() else len(name.encode("utf-8", "surrogateescape"))
                if size < U32 and header_offset < U32:
                    start = header_offset + fixed + name_len
                    predicted = start + (alignment - start % alignment) % alignment
                else:
                    predicted = predicted_data_offset(header_offset, name_len, size, alignment)
                if predicted - header_offset <= LOCAL_HEADER.size + name_len + U16:
                    trailer = e.next_header - predicted - csize
                    if trailer in (DESCRIPTOR_SIZES if e.flags & 8 else (0,)):
                        computed = predicted
            if computed is not None:
                e.data_offset = computed  # (its trailer, 0 or a descriptor, keeps it before the next record)
            else:
                e.data_offset = self.header_data_offset(e)
                e.header_checked = True

    def header_data_offset(self, e: ZipEntry) -> int:
        """The data offset of ``e`` its local header gives (one read), checked against the next record."""
        header = self.source.read(e.header_offset, LOCAL_HEADER.size)
        data_offset = self._local_data_offset(header, 0, e)
        if data_offset + e.compressed_size > e.next_header:
            raise CorruptCheckpointError(f"zip record {e.name!r} overlaps the next record")
        return data_offset

    def check_local_header(self, e: ZipEntry) -> None:
        """Checks, once, that the local header of ``e`` names it and puts its data where ``data_offset`` says."""
        if e.header_checked:
            return
        header = self.source.read(e.header_offset, e.data_offset - e.header_offset)
        name = e.name.encode("utf-8", "surrogateescape")
        actual = self._local_data_offset(header, 0, e) if len(header) >= LOCAL_HEADER.size else -1
        if actual != e.data_offset or header[LOCAL_HEADER.size : LOCAL_HEADER.size + len(name)] != name:
            raise CorruptCheckpointError(f"local header of zip record {e.name!r} at offset {e.header_offset} "
                                         f"disagrees with the central directory (data at offset {e.data_offset})")
        e.header_checked = True


def check_inflation(entry: ZipEntry, limits: Limits) -> None:
    """Refuses a deflated pickle or code record claiming more than ``max_pickle_inflation`` × its size (+1 MiB)."""
    allowed = limits.max_pickle_inflation * entry.compressed_size + (1 << 20)
    if entry.method == DEFLATED and entry.size > allowed:
        raise LimitExceededError(f"deflated record {entry.name!r} of {entry.compressed_size} bytes claims "
                                 f"{entry.size} bytes, more than {limits.max_pickle_inflation}x "
                                 f"(limit max_pickle_inflation)")


def find_end_record(tail: bytes) -> int:
    """Where the end-of-central-directory record starts in ``tail`` (the end of a file), or -1."""
    pos = len(tail)
    while pos > 0:
        pos = tail.rfind(EOCD_SIG, 0, pos)
        if pos < 0:
            break
        if pos + EOCD.size <= len(tail):
            comment_length = struct.unpack_from("<H", tail, pos + 20)[0]
            if pos + EOCD.size + comment_length == len(tail):
                return pos
    return -1


def ends_with_records(tail: bytes) -> bool:
    """Whether ``tail``, the end of a file, is a zip's end record announcing at least one record."""
    pos = find_end_record(tail)
    return pos >= 0 and EOCD.unpack_from(tail, pos)[4] != 0


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

