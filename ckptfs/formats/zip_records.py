"""A zip central directory as the compiled scanner read it: its records in columns, each entry made when asked for.

A torch.save archive of 200,000 storages has 200,000 records ``<archive>/data/<n>``; a ``ZipEntry`` for each costs
~280 bytes and ~1 µs to make, and the open needs of each only its size, method and CRC-32 (``storage_fields``) and
its data offset, which torch's alignment rule gives for all rows at once (``resolve_storages``). ``ZipRecords``
keeps the scanner's rows, finds a storage record's row by its number, and makes the few other records' entries at
once (the pickles, ``version``…: ``read_records`` reads them through their entries).

A record's entry, once made by ``records[name]``, is the one the archive hands out from then on (a writer changes
its CRC-32, a read marks its local header checked); ``records.get(name)`` makes a storage record's entry without
keeping it (the metadata cache asks for every one once). Rows are in header offset order: ``ZipArchive`` takes the
Python loop for a directory in any other order.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Callable

from ckptfs.errors import CorruptCheckpointError
from ckptfs.formats.zip_entry import ZipEntry
from ckptfs.pickle import cscan

_FIELDS = cscan.DIRECTORY_FIELDS
_MAX_DIGITS = 18


class ZipRecords(Mapping[str, ZipEntry]):
    """Records by name: ``prefix + "data/<n>"`` found by ``n``'s row, every other name's entry made at once."""

    def __init__(self, directory: bytes, rows: array[int], numbers: tuple[array[int], array[int]],
                 cd_offset: int) -> None:
        count = len(numbers[1])
        self._rows: array[int] | None = rows
        """The scanner's rows until the data offsets are computed from them (``resolve_storages``); the columns
        below hold what is read of them, in 34 bytes a record rather than 64."""
        self._name_length, self._method, self._flags = (_column(rows, field, "H") for field in (1, 2, 3))
        self._csize, self._size, self._header = (_column(rows, field, "q") for field in (4, 5, 6))
        self._crc = _column(rows, 7, "I")
        index = "i" if count < 1 << 31 else "q"
        self._number_of_row, self._row_of_number = (_narrowed(column, index) for column in numbers)
        self._cd_offset = cd_offset
        first = directory[rows[0] : rows[0] + rows[1]].decode("ascii")
        self.first_prefix = first[: first.index("/") + 1]
        self._data = self.first_prefix + "data/"
        self._data_offset = array("q", [-1]) * count
        self._checked = bytearray(count)
        self._made: dict[str, ZipEntry] = {}
        self._other_rows: dict[str, int] = {}
        """The row of each record without a number (few: the pickles, ``version``, a TorchScript's code…)."""
        for row, number in enumerate(self._number_of_row):
            if number < 0:
                name_at, name_length = rows[row * _FIELDS], rows[row * _FIELDS + 1]
                name = directory[name_at : name_at + name_length].decode("ascii")
                if self._other_rows.setdefault(name, row) != row:
                    raise CorruptCheckpointError(f"duplicate zip record {name!r}")
                self._made[name] = self._entry(row, name)
        self._other_names = {row: name for name, row in self._other_rows.items()}

    # -- the mapping ---------------------------------------------------------------------------------------------

    def __getitem__(self, name: str) -> ZipEntry:
        entry = self._made.get(name)
        if entry is None:
            row = self.row(name)
            if row is None:
                raise KeyError(name)
            entry = self._made[name] = self._entry(row, name)
        return entry

    def get(self, name: str, default: Any = None) -> Any:
        entry = self._made.get(name)
        if entry is not None:
            return entry
        row = self.row(name)
        return default if row is None else self._entry(row, name)

    def __contains__(self, name: object) -> bool:
        return type(name) is str and self.row(name) is not None

    def __iter__(self) -> Iterator[str]:
        data, others = self._data, self._other_names
        for row, number in enumerate(self._number_of_row):
            yield others[row] if number < 0 else data + str(number)

    def __len__(self) -> int:
        return len(self._number_of_row)

    def unnumbered(self) -> Iterator[str]:
        """The names of the records without a number, in the directory's order (the numbered ones start with the
        first name's prefix)."""
        return iter(self._other_rows)

    # -- rows ----------------------------------------------------------------------------------------------------

    def row(self, name: str) -> int | None:
        """The row of the record named ``name``, or None."""
        data = self._data
        if name.startswith(data):
            row = self._numbered_row(name[len(data) :])
            if row is not None:
                return row if row >= 0 else None
        return self._other_rows.get(name)

    def _numbered_row(self, digits: str) -> int | None:
        """The row numbered ``digits`` (-1: none), or None where the scanner numbers no name ending so (``n`` in
        decimal without leading zeros, below the record count)."""
        if (digits.isdigit() and digits.isascii() and len(digits) <= _MAX_DIGITS
                and (digits[0] != "0" or len(digits) == 1)):
            number = int(digits)
            if number < len(self._row_of_number):
                return self._row_of_number[number]
        return None

    def storage_fields(self, directory: str, key: str, number: int | None = None) -> tuple[int, int, int, int] | None:
        """The row of storage ``key``'s record (``<prefix><directory>/<key>``) and the size, method and CRC-32 the
        directory gives it, or None; ``number``: the key's as the scanner reads it (-1: none), where known."""
        # Once per storage (~200,000 for a large MoE): no name made for a record ``data/<n>``.
        row = None
        if directory == "data":
            if number is None:
                row = self._numbered_row(key)
            elif 0 <= number < len(self._row_of_number):
                row = self._row_of_number[number]
        if row is None:
            row = self._other_rows.get(f"{self.first_prefix}{directory}/{key}", -1)
        if row < 0:
            return None
        return row, self._size[row], self._method[row], self._crc[row]

    def storage_columns(self) -> tuple[array[int], array[int], array[int], array[int]]:
        """The row of each record number (-1 where none), and by row the size, method and CRC-32 the directory gives
        (``storage_fields`` of many storages, indexed without a tuple or an int kept per storage)."""
        return self._row_of_number, self._size, self._method, self._crc

    def fields_at(self, rows: Sequence[int], fields: Sequence[str]) -> list[list[int]]:
        """Of each named ``ZipEntry`` field (``data_offset`` too), its values at ``rows`` (-1 where a row is -1): the
        entries' fields as columns, without an entry made for each (a metadata cache entry's)."""
        columns = {"header_offset": self._header, "method": self._method, "flags": self._flags,
                   "compressed_size": self._csize, "size": self._size, "crc": self._crc, "data_offset": self._data_offset}
        found = []
        for field in fields:
            column = columns[field]
            found.append([column[row] if row >= 0 else -1 for row in rows])
        return found

    def resolve_storages(self, rows: Sequence[int], alignment: int,
                         read_offset: Callable[[ZipEntry], int]) -> list[int]:
        """The data offset of each of ``rows``, kept: computed by torch's rule where the directory shows its layout,
        else ``read_offset`` of the record's entry (its local header read, and so checked)."""
        # Every row's offset is computed (one C loop); a record no storage names is checked before its first use.
        if self._rows is None:
            computed = self._data_offset
        else:
            computed = cscan.data_offsets(self._rows, len(self._row_of_number), self._cd_offset, alignment)
            self._rows = None
        numbers, made = self._number_of_row, self._made
        for row in [row for row in rows if computed[row] < 0 or numbers[row] < 0]:
            entry = made.get(self._other_names[row]) if numbers[row] < 0 else None
            if computed[row] < 0:
                computed[row] = read_offset(entry or self._entry(row, self.name(row)))
                self._checked[row] = 1
            if entry is not None:
                entry.data_offset, entry.header_checked = computed[row], bool(self._checked[row])
        if len(made) > len(self._other_rows):  # entries of numbered records made before: kept in step
            for name, entry in made.items():
                row = self.row(name)
                if name not in self._other_rows and row is not None and entry.data_offset < 0:
                    entry.data_offset, entry.header_checked = computed[row], bool(self._checked[row])
        self._data_offset = computed
        return [computed[row] for row in rows]

    def name(self, row: int) -> str:
        number = self._number_of_row[row]
        return self._other_names[row] if number < 0 else self._data + str(number)

    def _entry(self, row: int, name: str) -> ZipEntry:
        header = self._header
        following = header[row + 1] if row + 1 < len(header) else self._cd_offset
        return ZipEntry(name, self._method[row], self._flags[row], self._csize[row], self._size[row], header[row],
                        self._data_offset[row], bool(self._checked[row]), self._crc[row], following)


def _column(rows: array[int], field: int, code: str) -> array[int]:
    """Field ``field`` of every row, as an array of typecode ``code``, which holds its every value."""
    return _narrowed(rows[field::_FIELDS], code)


def _narrowed(column: array[int], code: str) -> array[int]:
    """The int64s of ``column`` as an array of typecode ``code``, which holds their every value: each one's low
    bytes (two's complement), taken by one strided copy rather than an int object per value."""
    step = column.itemsize // array(code).itemsize
    if step == 1:
        return column
    low = 0 if sys.byteorder == "little" else step - 1
    return array(code, bytes(memoryview(column).cast("B").cast(code)[low::step]))
