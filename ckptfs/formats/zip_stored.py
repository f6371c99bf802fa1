"""A parsed archive's records once its storages' data offsets are known: the storage records in columns, for a
directory the Python loop read (``ZipRecords`` keeps the compiled scanner's rows from the start).

A ``ZipEntry`` with its name and fields costs ~280 bytes, kept for every record of the directory; a storage's
record is wanted again only when its storage is first read (its local header checked), written, or the parse
cached. ``StoredRecords`` keeps the other records (the pickles, ``version``…) as entries and each storage's record
as a row of typed arrays (~41 bytes), and makes its entry when asked for: ``records[name]`` keeps the entry made
(a writer changes its CRC-32), ``records.get(name)`` does not (the metadata cache asks for every one once).
"""

from __future__ import annotations

from array import array
from operator import attrgetter
from typing import Any

from ckptfs.formats.zip_archive import ZipEntry
from ckptfs.model.records import Storage


class StoredRecords(dict):  # type: ignore[type-arg]
    """Records by name: ``others`` held as they are, each of ``storages``' from its row of ``records``."""

    def __init__(self, prefix: str, others: dict[str, ZipEntry], storages: list[Storage],
                 records: list[ZipEntry]) -> None:
        super().__init__(others)
        self._prefix = prefix
        self._storages = storages
        self._rows: dict[str, int] | None = None
        """Each storage's row by its record name, made if a name is not found where its key's number says."""
        def column(code: str, field: str) -> array[int]:
            return array(code, map(attrgetter(field), records))

        self._header_offset = column("q", "header_offset")
        self._compressed_size = column("q", "compressed_size")
        self._size = column("q", "size")
        self._data_offset = column("q", "data_offset")
        self._crc = column("L", "crc")
        self._method = column("H", "method")
        self._flags = column("H", "flags")
        self._checked = bytearray(map(attrgetter("header_checked"), records))

    def __missing__(self, name: str) -> ZipEntry:
        entry = self._made(name)
        if entry is None:
            raise KeyError(name)
        self[name] = entry
        return entry

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        found = dict.get(self, name)
        if found is not None:
            return found
        made = self._made(name)
        return default if made is None else made

    def __contains__(self, name: object) -> bool:
        return dict.__contains__(self, name) or (type(name) is str and self._row(name) is not None)

    def _made(self, name: str) -> ZipEntry | None:
        row = self._row(name)
        if row is None:
            return None
        return ZipEntry(name, self._method[row], self._flags[row], self._compressed_size[row], self._size[row],
                        self._header_offset[row], self._data_offset[row], bool(self._checked[row]), self._crc[row])

    def _row(self, name: str) -> int | None:
        if not name.startswith(self._prefix):
            return None
        record = name[len(self._prefix) :]
        # torch.save numbers its storages' keys in the order the pickle first names them: the storage's row.
        key = record[record.find("/") + 1 :]
        storages = self._storages
        if key.isdigit() and key.isascii():
            row = int(key)
            if row < len(storages) and storages[row].record == record:
                return row
        if self._rows is None:
            self._rows = {storage.record: row for row, storage in enumerate(storages)}
        return self._rows.get(record)
