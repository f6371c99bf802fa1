"""A parse as entry sections, and back: the object tree and its storages, and for a torch.save or TorchScript
zip each storage's record (header offset, method, flags, compressed size), checked against the source.

Zip, TorchScript, legacy (torch < 1.6), ``.pt2`` checkpoints (their payload archives' storages, which have no
record of their own, as flagged rows) and torch.distributed.checkpoint directories (their chunked tensors:
``chunks_codec``) are cached: their parse grows with the tensor count. A directory whose bytes items hold
tensors (storages in its files) is not. A restored archive knows only the storage records, and checks each
one's local header before its first read, as after a parse; a restored legacy file checks each storage's
element count header the same way.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from ckptfs.cache.entry_key import CACHED_FORMATS
from ckptfs.cache.errors import BadEntry, NotCacheable
from ckptfs.errors import CorruptCheckpointError
from ckptfs.cache.layout import Sections, array, blob
from ckptfs.cache.records_codec import COMPRESSED, IN_SOURCE, encode_records
from ckptfs.cache.tree_decode import decode_tree
from ckptfs.cache.tree_encode import TreeEncoder
from ckptfs.formats.dcp_directory import DcpParsed
from ckptfs.formats.interface import ParsedCheckpoint
from ckptfs.formats.legacy import LegacyParsed
from ckptfs.formats.pt2 import Pt2Parsed
from ckptfs.formats.zip_archive import DEFLATED, LOCAL_HEADER, STORED, U16, ZipArchive, ZipEntry
from ckptfs.formats.zip_checkpoint import ZipParsed
from ckptfs.formats.zip_records import ZipRecords
from ckptfs.limits import Limits
from ckptfs.model.records import Storage
from ckptfs.sources import ByteSource, SourceSet

ZIP_FIELDS = ("header_offset", "method", "flags", "compressed_size", "crc")
DETAIL_TYPES = (str, int, bool, type(None))


def encode_parsed(parsed: ParsedCheckpoint, source: ByteSource) -> Sections:
    if parsed.format not in CACHED_FORMATS or type(parsed) not in (ZipParsed, LegacyParsed, DcpParsed, Pt2Parsed):
        raise NotCacheable(f"{parsed.format} checkpoints are not cached")
    archive = parsed.archive if isinstance(parsed, ZipParsed) else None
    encoder = TreeEncoder(source)
    listed = [encoder.storage(s) for s in parsed.storages]
    root = encoder.encode(parsed.root)
    sections = encode_records(encoder)
    zip_columns = _zip_columns(parsed, encoder.storage_list)
    details = parsed.details
    if not all(type(k) is str and _is_detail(v) for k, v in details.items()):
        raise NotCacheable("format details other than strings, integers, flags and lists of strings")
    meta = {"format": parsed.format, "byteorder": parsed.byteorder, "details": details, "root": int(
        encoder.globalize([root])[0]), "prefix": archive.prefix if archive else "",
        "cd_offset": archive.cd_offset if archive else 0}
    return {
        **encoder.sections(),
        **sections,
        **{f"zip_{f}": np.asarray(v, dtype=np.int64) for f, v in zip_columns.items()},
        "listed_storages": np.asarray(listed, dtype=np.int64),
        "meta": json.dumps(meta, ensure_ascii=False).encode("utf-8", "surrogatepass"),
    }


def _zip_columns(parsed: ParsedCheckpoint, storages: list[Storage]) -> dict[str, list[int]]:
    """Each storage's zip record's ``ZIP_FIELDS`` (-1 for a storage with none: in the pickle, a legacy file, a .pt2's
    embedded archive), each record checked to hold the storage's bytes where the parse found them."""
    archive = parsed.archive if isinstance(parsed, ZipParsed) else None
    records = None if archive is None else archive.entries
    if type(parsed) is ZipParsed and isinstance(records, ZipRecords):  # a torch.save zip's: no entry made for each
        assert archive is not None
        prefix, row = archive.prefix, records.row
        rows = [-1 if s.source is None else row(prefix + s.record) for s in storages]
        if None in rows:
            raise NotCacheable("a storage has no zip record")
        *columns, data_offsets = records.fields_at(rows, (*ZIP_FIELDS, "data_offset"))  # type: ignore[arg-type]
        if data_offsets != [-1 if s.source is None else s.offset for s in storages]:
            raise NotCacheable("a storage's zip record is not at its offset")
        return dict(zip(ZIP_FIELDS, columns))
    zip_columns: dict[str, list[int]] = {f: [] for f in ZIP_FIELDS}
    for storage in storages:
        entry = None
        if archive is not None and storage.source is not None:
            entry = archive.entries.get(archive.prefix + storage.record)
            embedded = entry is None and type(parsed) is Pt2Parsed and not storage.compressed
            if (entry is None and not embedded) or (entry is not None and entry.data_offset != storage.offset):
                raise NotCacheable(f"storage {storage.key!r} has no zip record at its offset")
        for field in ZIP_FIELDS:
            zip_columns[field].append(-1 if entry is None else getattr(entry, field))
    return zip_columns


def decode_parsed(sections: Sections, source: ByteSource, limits: Limits) -> ParsedCheckpoint:
    try:
        meta = json.loads(blob(sections, "meta").decode("utf-8", "surrogatepass"))
    except (UnicodeDecodeError, ValueError):
        raise BadEntry("entry's meta section is not JSON") from None
    if not isinstance(meta, dict):
        raise BadEntry("entry's meta section is not an object")
    fmt, byteorder, details, root_ref = meta.get("format"), meta.get("byteorder"), meta.get("details"), meta.get("root")
    prefix, cd_offset = meta.get("prefix"), meta.get("cd_offset")
    if (fmt not in CACHED_FORMATS or byteorder not in ("little", "big") or not isinstance(details, dict)
            or type(root_ref) is not int or not isinstance(prefix, str) or type(cd_offset) is not int
            or not 0 <= cd_offset <= source.size):
        raise BadEntry("entry's meta section is incomplete")
    if not all(map(_is_detail, details.values())):
        raise BadEntry("entry's format details are not strings, integers, flags and lists of strings")
    root, storages, _ = decode_tree(sections, root_ref, source, limits)
    listed = array(sections, "listed_storages")
    if len(listed) and (int(listed.min()) < 0 or int(listed.max()) >= len(storages)):
        raise BadEntry("a listed storage is not in the storage table")
    listed_storages = (list(storages) if np.array_equal(listed, np.arange(len(storages)))
                       else [storages[i] for i in listed.tolist()])
    if fmt == "legacy":
        return LegacyParsed(fmt, root, listed_storages, byteorder, details, source=source)
    if fmt == "pt2":
        archive = ZipArchive.restored(source, limits, prefix, cd_offset, _Entries(
            prefix, storages, {f: array(sections, f"zip_{f}", len(storages)) for f in ZIP_FIELDS}, cd_offset,
            sections, embedded_allowed=True))
        return Pt2Parsed(fmt, root, listed_storages, byteorder, details, archive=archive, limits=limits)
    if fmt == "dcp":
        if not isinstance(source, SourceSet) or any(s.source is not None for s in storages):
            raise BadEntry("a directory's entry for another source, or with storages in the source")
        return DcpParsed(fmt, root, listed_storages, byteorder, details, directory=source, limits=limits)
    entries = _Entries(prefix, storages, {f: array(sections, f"zip_{f}", len(storages)) for f in ZIP_FIELDS},
                       cd_offset, sections)
    archive = ZipArchive.restored(source, limits, prefix, cd_offset, entries)
    return ZipParsed(fmt, root, listed_storages, byteorder, details, archive=archive, limits=limits)


def _is_detail(value: Any) -> bool:
    return type(value) in DETAIL_TYPES or (type(value) is list and all(type(v) is str for v in value))


class _Entries(dict):  # type: ignore[type-arg]
    """The storage records by name, each ZipEntry made when first asked for (a read of its storage)."""

    def __init__(self, prefix: str, storages: list[Storage], columns: dict[str, np.ndarray], cd_offset: int,
                 sections: Sections, embedded_allowed: bool = False) -> None:
        super().__init__()
        flags = array(sections, "storage_flags", len(storages))
        in_source, compressed = (flags & IN_SOURCE) != 0, (flags & COMPRESSED) != 0
        data_offset = array(sections, "storage_offset", len(storages))
        size = array(sections, "storage_size", len(storages))
        header, method, csize = columns["header_offset"], columns["method"], columns["compressed_size"]
        embedded = in_source & (header == -1) & (method == -1) if embedded_allowed else np.zeros_like(in_source)
        """Storages of a torch.save archive stored in a .pt2's record: no record of their own, checked at the
        parse (``formats.embedded``); their stored bytes lie before the central directory."""
        gap = data_offset - header
        bad = in_source & ~embedded & (
            (header < 0) | (gap < LOCAL_HEADER.size) | (gap > LOCAL_HEADER.size + 3 * U16)
            | (csize < 0) | (csize > cd_offset - data_offset)
            | ((method != STORED) & (method != DEFLATED)) | (compressed != (method == DEFLATED))
            | ((method == STORED) & (csize != size)))
        bad |= embedded & (compressed | (size > cd_offset - data_offset))
        if len(storages) and bool(np.any(bad)):
            raise BadEntry("a storage's zip record does not fit the archive")
        self._embedded = set(np.nonzero(embedded)[0].tolist())
        self._storages = storages
        self._columns = {f: c.tolist() for f, c in columns.items()}
        self._prefix = prefix
        self._rows: dict[str, int] | None = None

    def __missing__(self, name: str) -> ZipEntry:
        if self._rows is None:
            self._rows = {self._prefix + s.record: i for i, s in enumerate(self._storages)
                          if s.source is not None and i not in self._embedded}
        row = self._rows.get(name)
        if row is None:  # only an entry made to pass its digest gets here
            raise CorruptCheckpointError(f"metadata cache entry names no zip record {name!r}")
        storage = self._storages[row]
        c = self._columns
        entry = ZipEntry(name, c["method"][row], c["flags"][row], c["compressed_size"][row], storage.size,
                         c["header_offset"][row], storage.offset, crc=c["crc"][row])
        self[name] = entry
        return entry

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        try:
            return self[name]
        except CorruptCheckpointError:
            return default
