"""``torch.save`` zip checkpoints (torch ≥ 1.6) and TorchScript archives."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Sequence

from ckptfs.errors import CorruptCheckpointError, LimitExceededError, NotACheckpointError, UnsupportedError
from ckptfs.formats import zip_columns
from ckptfs.formats.deflate_index import DeflateIndex, DeflateIndexes
from ckptfs.formats.interface import ParsedCheckpoint, shared_storage, storage_persistent_id
from ckptfs.formats.prefetch import Prefetch
from ckptfs.formats.torchscript import mark_parameters
from ckptfs.formats.zip_archive import DEFLATED, NOT_A_CHECKPOINT, STORED, ZipArchive, check_inflation
from ckptfs.formats.zip_records import ZipRecords
from ckptfs.formats.zip_stored import StoredRecords
from ckptfs.limits import Limits
from ckptfs.model import rebuild
from ckptfs.model.dtypes import DType, dtype_of_storage_class
from ckptfs.model.records import RecordPrefix, Storage
from ckptfs.pickle import unpickler
from ckptfs.pickle.unpickler import SafeUnpickler
from ckptfs.pickle.values import PickledObject

SMALL_RECORDS = ["byteorder", ".storage_alignment", ".format_version", "version", ".data/version"]
MAX_SMALL_RECORD = 4096
_METHODS = (STORED, DEFLATED)
CONSTANTS_KEY = "constants.pkl"
"""Where a TorchScript archive's constants appear in the tree: a name no attribute can have."""


class _StorageTable:
    """Storages of one pickle's record directory (``data/`` or ``constants/``)."""

    def __init__(self, archive: ZipArchive, directory: str, byteorder: str) -> None:
        self.archive = archive
        self.directory = directory
        self.record_prefix = RecordPrefix(directory + "/")
        self.byteorder = byteorder
        # skip_data reserves a storage's record and gives it CRC-32 0, which no n ≥ 1 bytes of zeros have.
        # When the writer computed no CRCs at all (data.pkl's is 0 too), unwritten records cannot be told.
        self.crcs_computed = archive.entries[archive.prefix + "data.pkl"].crc != 0
        self.storages: dict[str, Storage] = {}
        self.entries, self.prefix = archive.entries, archive.prefix
        self.rows = self.entries if isinstance(self.entries, ZipRecords) else None
        """The directory's rows where the compiled scanner read it: a storage's record is then its row."""
        self.made: list[Any] | array[int] = [] if self.rows is None else array("q")
        """The record (entry or row) of each storage ``storage`` made (not the zero-byte aliases of
        ``shared_storage``), in order."""

    def forget(self) -> None:
        """Empties the table: the reference parse makes it again."""
        self.storages.clear()
        del self.made[:]

    def storage_records(self) -> list[Any] | array[int]:
        """The record (entry or row) of each storage in ``storages``, in its order: the ones ``storage`` found,
        unless there are aliases among them."""
        if len(self.made) == len(self.storages):
            return self.made
        find = self.entries.__getitem__ if self.rows is None else self.rows.row
        return [find(self.prefix + storage.record) for storage in self.storages.values()]

    def persistent_load(self, pid: Any) -> Storage:
        cls, key, location, numel, _ = storage_persistent_id(pid, 5)
        dtype = dtype_of_storage_class(cls.module, cls.name)
        if dtype is None:
            raise CorruptCheckpointError(f"unknown storage class {cls.qualname} for storage {key!r}")
        return self.storage(key, dtype, location, numel)

    def storage(self, key: str, dtype: DType, location: str, numel: int, number: int | None = None) -> Storage:
        """The storage a valid persistent id names (``zip_columns`` calls it with the scanner's checked ids and the
        key's number)."""
        storages = self.storages
        if key in storages:
            known = shared_storage(storages, key, dtype, numel)
            if known is not None:
                return known
        record = self.record_prefix + key
        rows = self.rows
        if rows is None:
            entry = self.entries.get(self.prefix + record)
            if entry is None:
                raise CorruptCheckpointError(f"storage record {record!r} is missing from the archive")
            made, size, method, crc = entry, entry.size, entry.method, entry.crc
        else:
            fields = rows.storage_fields(self.directory, key, number)
            if fields is None:
                raise CorruptCheckpointError(f"storage record {record!r} is missing from the archive")
            made, size, method, crc = fields
        nbytes = numel * dtype.itemsize
        if size != nbytes:
            raise CorruptCheckpointError(
                f"record {record!r} holds {size} bytes but its storage declares {nbytes} "
                f"({numel} × {dtype.itemsize})"
            )
        if method != STORED and method != DEFLATED:
            raise UnsupportedError(f"record {record!r} uses compression method {method}")
        return self._new_storage(key, dtype, location, numel, made, size, method, crc)

    def storages_of(self, keys: list[str], dtypes: list[DType], locations: list[str], numels: Sequence[int],
                    numbers: Sequence[int]) -> list[Storage]:
        """``storage`` of each key, dtype, location, numel and the key's number, in order: in one loop for the common
        storage (met first, numbered, its record's size and method right), ``storage`` for any other."""
        specs = zip(keys, dtypes, locations, numels, numbers)
        rows = self.rows
        if rows is None or self.directory != "data":
            return [self.storage(*spec) for spec in specs]
        storages, made, storage = self.storages, self._new_storage, self.storage
        row_of_number, sizes, methods, crcs = rows.storage_columns()
        count = len(row_of_number)
        found = []
        for key, dtype, location, numel, number in specs:
            row = row_of_number[number] if 0 <= number < count else -1
            if (row >= 0 and key not in storages and (size := sizes[row]) == numel * dtype.itemsize
                    and (method := methods[row]) in _METHODS):
                found.append(made(key, dtype, location, numel, row, size, method, crcs[row]))
            else:
                found.append(storage(key, dtype, location, numel, number))
        return found

    def _new_storage(self, key: str, dtype: DType, location: str, numel: int, record: Any, size: int, method: int,
                     crc: int) -> Storage:
        """A new storage of ``record`` (its entry or row), checked."""
        # Once per storage (~200,000 for a large MoE): each field set once, no property calls.
        storage = Storage(key, dtype, location, numel, self.record_prefix, -1, size, self.byteorder,
                          method == DEFLATED, not (self.crcs_computed and size and crc == 0), None, None, 0,
                          self.archive.source)
        self.storages[key] = storage
        self.made.append(record)
        return storage


def probe(opening: Prefetch, head: bytes, limits: Limits) -> bool:
    """A zip archive's first local header (its prefix and records are checked on opening)."""
    return head.startswith(b"PK\x03\x04")


def open_zip(opening: Prefetch, limits: Limits) -> ParsedCheckpoint:
    return open_archive(ZipArchive(opening, limits), limits)


def open_archive(archive: ZipArchive, limits: Limits) -> ParsedCheckpoint:
    """A torch.save or TorchScript archive whose central directory is parsed."""
    is_torchscript = archive.entry("constants.pkl") is not None
    if archive.entry("data.pkl") is None:
        raise NotACheckpointError(NOT_A_CHECKPOINT)
    pickles = ["data.pkl", "constants.pkl"] if is_torchscript else ["data.pkl"]
    for name in pickles:
        check_inflation(archive.entries[archive.prefix + name], limits)
    records = archive.read_records({**dict.fromkeys(SMALL_RECORDS, MAX_SMALL_RECORD),
                                    **dict.fromkeys(pickles, limits.max_pickle_bytes)})
    byteorder = _byteorder(records.get("byteorder"))
    alignment = _alignment(records.get(".storage_alignment"))

    data = _StorageTable(archive, "data", byteorder)
    root = _load(records["data.pkl"], data, limits)
    tables = [data]
    if is_torchscript:
        constants = _StorageTable(archive, "constants", byteorder)
        constant_values = _load(records["constants.pkl"], constants, limits)
        tables.append(constants)
        root = _attach_constants(root, constant_values)
        mark_parameters(archive, root, limits)

    storages = [s for table in tables for s in table.storages.values()]
    stored: list[Any] | array[int] = array("q") if isinstance(archive.entries, ZipRecords) else []
    for table in tables:
        stored.extend(table.storage_records())
    records_count = len(archive.entries)
    if isinstance(archive.entries, ZipRecords):
        offsets = archive.entries.resolve_storages(stored, alignment, archive.header_data_offset)
        for storage, offset in zip(storages, offsets):
            storage.offset = offset
    else:
        archive.resolve_data_offsets(stored, alignment)
        for storage, entry in zip(storages, stored):
            storage.offset = entry.data_offset
        others = dict(archive.entries)
        for name in map(attrgetter("name"), stored):
            others.pop(name, None)  # (an alias's record is its storage's, met twice)
        archive.entries = StoredRecords(archive.prefix, others, storages, stored)
    archive.finish_opening()

    details = {
        "archive_prefix": archive.prefix.rstrip("/"),
        "records": records_count,
        "storage_alignment": alignment,
        "format_version": _text(records.get(".format_version")),
        "version": _text(records.get("version") or records.get(".data/version")),
    }
    if any(not storage.written for storage in storages):
        details["skip_data"] = True
    return ZipParsed("torchscript" if is_torchscript else "zip", root, storages, byteorder, details,
                     archive=archive, limits=limits)


@dataclass
class ZipParsed(ParsedCheckpoint):
    archive: ZipArchive = field(kw_only=True)
    limits: Limits = field(kw_only=True)

    indexes: DeflateIndexes = field(default_factory=DeflateIndexes, kw_only=True)

    def verify(self, storage: Storage) -> None:
        """Checks the record's local header against the data offset computed at open."""
        self.archive.check_local_header(self.archive.entries[self.archive.prefix + storage.record])

    def read_inflated(self, storage: Storage, offset: int, length: int) -> bytes:
        entry = self.archive.entries[self.archive.prefix + storage.record]
        if entry.size > self.limits.max_inflated_bytes:
            raise LimitExceededError(f"deflated record {entry.name!r} of {entry.size} bytes exceeds "
                                     f"{self.limits.max_inflated_bytes} (limit max_inflated_bytes)")

        def make() -> DeflateIndex:
            if entry.data_offset < 0:
                self.archive.resolve_data_offsets([entry], alignment=None)
            return DeflateIndex(self.archive.source, entry.name, entry.data_offset, entry.compressed_size, entry.size)

        return self.indexes.get(entry.name, make).read(offset, length)


def _load(pickle_bytes: bytes, table: _StorageTable, limits: Limits) -> Any:
    if unpickler.FAST_PATHS:
        root = zip_columns.load(pickle_bytes, table.storages_of, table.forget, limits)
        if root is not None:
            return root
    return SafeUnpickler(pickle_bytes, resolve=rebuild.resolve, persistent_load=table.persistent_load,
                         limits=limits).load()


def _attach_constants(root: Any, constants: Any) -> Any:
    if not isinstance(constants, tuple) or not constants:
        return root
    if isinstance(root, PickledObject) and isinstance(root.state, dict):
        root.state[CONSTANTS_KEY] = constants
    return root


def _byteorder(raw: bytes | None) -> str:
    if raw is None:
        return "little"
    text = raw.decode("ascii", "replace").strip()
    if text not in ("little", "big"):
        raise CorruptCheckpointError(f"byteorder record says {text!r}, not 'little' or 'big'")
    return text


def _alignment(raw: bytes | None) -> int:
    if raw is None:
        return 64
    text = raw.decode("ascii", "replace").strip()
    if not text.isdigit() or not 0 < int(text) <= 1 << 30:
        raise CorruptCheckpointError(f".storage_alignment record says {text!r}, not a positive integer")
    return int(text)


def _text(raw: bytes | None) -> str | None:
    return raw.decode("ascii", "replace").strip() if raw is not None else None
