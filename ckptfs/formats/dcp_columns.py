"""A DCP ``.metadata`` pickle made into its records from the compiled scanner's rows (``ckptfs.pickle.cscan.dcp``).

The rows stand for what the reference interpreter's value holds where ``dcp_metadata.parse_metadata`` reads it,
in the pickle's order. The scanner made ``dcp_metadata``'s checks (classes, attribute names, kinds of values, sizes
as non-negative int64s of at most 64 dimensions and fewer than 2**62 elements, chunks of the tensor's rank inside
it, file names and byte ranges, non-empty planner paths) and refused where one would fail; a dtype ckptfs does not
know is refused here. The pure-Python paths then parse the same bytes (their error is the answer): ``metadata``
returns None.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckptfs.formats.dcp_records import Box, DcpMetadata, ItemKey, StorageInfo, TensorItem
from ckptfs.limits import Limits
from ckptfs.model.dtypes import DType, dtype_by_name
from ckptfs.pickle import cscan


class _Refused(Exception):
    """The rows would not make what the reference makes."""


@dataclass
class Scanned:
    """One ``.metadata`` pickle's rows: the direct rows (``dcp_tree.DcpTree.add_scanned`` makes tensors of them)
    where the scanner made them, and the records (made when first asked for where it did)."""

    data: bytes
    tables: dict[str, memoryview]
    dtypes: list[DType]
    """By the ``dtypes`` table's rows; empty without direct rows."""
    made: DcpMetadata | None
    """The records, made already when there are no direct rows."""

    @property
    def direct(self) -> bool:
        return bool(self.tables["header"][3])

    def records(self) -> DcpMetadata:
        if self.made is None:
            self.made = _records(self.data, self.tables)  # refuses no dtype: each was known (``scan``)
        return self.made

    def texts(self, table: str) -> list[str]:
        """The strings a table of (offset, length) rows names."""
        bounds = self.tables[table].tolist()
        return [self.data[at : at + length].decode("ascii") for at, length in zip(bounds[0::2], bounds[1::2])]

    @property
    def version(self) -> str | None:
        at, length = self.tables["header"][0:2].tolist()
        return self.data[at : at + length].decode("ascii") if at >= 0 else None


def scan(data: bytes, limits: Limits) -> Scanned | None:
    """The rows of one ``.metadata`` pickle, or None for the pure-Python paths."""
    data = bytes(data)  # the same object when it is bytes already: the rows' strings are sliced from it
    tables = cscan.dcp(data, limits)
    if tables is None:
        return None
    if tables["header"][3]:
        dtypes = [dtype_by_name(name) for name in Scanned(data, tables, [], None).texts("dtypes")]
        if None in dtypes:
            return None
        return Scanned(data, tables, dtypes, None)  # type: ignore[arg-type]
    try:
        return Scanned(data, tables, [], _records(data, tables))
    except _Refused:
        return None


def metadata(data: bytes, limits: Limits) -> DcpMetadata | None:
    """The records of one ``.metadata`` pickle, or None for the pure-Python paths."""
    scanned = scan(data, limits)
    return None if scanned is None else scanned.records()


def _records(data: bytes, tables: dict[str, memoryview]) -> DcpMetadata:
    pool = tuple(tables["pool"].tolist())
    items_rows = tables["items"].tolist()
    # A name is one opcode's text, met again through the memo (planner_data, storage_data): known by its offset.
    names = [data[at : at + length].decode("ascii") for at, length in zip(items_rows[0::3], items_rows[1::3])]
    texts = dict(zip(items_rows[0::3], names))
    tensor_rows = tables["tensors"].tolist()
    dtypes: dict[int, DType] = {}
    for at, length in set(zip(tensor_rows[0::7], tensor_rows[1::7])):
        dtype = dtype_by_name(data[at : at + length].decode("ascii"))
        if dtype is None:
            raise _Refused
        dtypes[at] = dtype
    chunks = tables["chunks"].tolist()
    boxes = [Box(pool[a : a + rank], pool[b : b + rank]) for a, rank, b, _ in zip(*[iter(chunks)] * 4)]
    tensors = [TensorItem(dtypes[at], pool[size_at : size_at + rank], grad == 1, boxes[first : first + count])
               for at, _, grad, size_at, rank, first, count in zip(*[iter(tensor_rows)] * 7)]
    items: dict[str, TensorItem | None] = {
        name: tensors[row] if row >= 0 else None for name, row in zip(names, items_rows[2::3])}
    storage: dict[ItemKey, StorageInfo] = {}
    for fqn_at, fqn_length, offset_at, rank, path_at, path_length, start, length in zip(
            *[iter(tables["storage"].tolist())] * 8):
        storage[_text(data, texts, fqn_at, fqn_length), None if offset_at < 0 else pool[offset_at : offset_at + rank]] \
            = StorageInfo(_text(data, texts, path_at, path_length), start, length, ())
    version_at, version_length, has_planner, _ = tables["header"].tolist()
    planner = None
    if has_planner:
        paths = tables["paths"].tolist()
        planner = {}
        for key_at, key_length, first, count in zip(*[iter(tables["planner"].tolist())] * 4):
            at = first * 3
            planner[_text(data, texts, key_at, key_length)] = (
                (_text(data, texts, paths[at + 1], paths[at + 2]),) if count == 1 and paths[at] == 0 else
                tuple(_text(data, texts, paths[p + 1], paths[p + 2]) if paths[p] == 0 else paths[p + 1]
                      for p in range(at, at + count * 3, 3)))
    version = _text(data, texts, version_at, version_length) if version_at >= 0 else None
    return DcpMetadata(items, planner, storage, version)


def _text(data: bytes, texts: dict[int, str], at: int, length: int) -> str:
    found = texts.get(at)
    if found is None:
        found = texts[at] = data[at : at + length].decode("ascii")
    return found
