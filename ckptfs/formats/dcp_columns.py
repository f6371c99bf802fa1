"""A DCP ``.metadata`` pickle made into its records from the compiled scanner's rows (``ckptfs.pickle.cscan.dcp``).

The rows stand for what the reference interpreter's value holds where ``dcp_metadata.parse_metadata`` reads it,
in the pickle's order: the scanner checked the forms (classes, attribute names, kinds of values, sizes as
non-negative int64s of at most 64 dimensions); the records are made here with ``dcp_metadata``'s own checks.
Whatever would raise makes the pure-Python paths parse instead (their error is the answer): ``metadata`` returns
None.
"""

from __future__ import annotations

import math
from typing import Any

from ckptfs.errors import CkptfsError
from ckptfs.formats.dcp_records import (
    MAX_ELEMENTS,
    DcpMetadata,
    ItemKey,
    StorageInfo,
    TensorItem,
    checked_box,
    checked_info,
)
from ckptfs.limits import Limits
from ckptfs.model.dtypes import DType, dtype_by_name
from ckptfs.pickle import cscan

_UNSEEN: Any = object()


class _Refused(Exception):
    """The rows would not make what the reference makes."""


def metadata(data: bytes, limits: Limits) -> DcpMetadata | None:
    """The records of one ``.metadata`` pickle, or None for the pure-Python paths."""
    data = bytes(data)  # the same object when it is bytes already: the rows' strings are sliced from it
    tables = cscan.dcp(data, limits)
    if tables is None:
        return None
    try:
        return _records(data, tables)
    except (_Refused, CkptfsError, UnicodeDecodeError):
        return None


def _records(data: bytes, tables: dict[str, memoryview]) -> DcpMetadata:
    # A name is one opcode's text, met again through the memo (planner_data, storage_data): known by its offset.
    texts: dict[int, str] = {}

    def text(at: int, length: int) -> str:
        found = texts.get(at)
        if found is None:
            found = texts[at] = data[at : at + length].decode("ascii")
        return found

    pool = tuple(tables["pool"].tolist())
    dtypes: dict[int, DType | None] = {}
    chunks = tables["chunks"].tolist()
    tensors = []
    for name_at, name_length, grad, size_at, rank, first, count in cscan.rows(tables["tensors"], 7):
        dtype = dtypes.get(name_at, _UNSEEN)
        if dtype is _UNSEEN:
            dtype = dtypes[name_at] = dtype_by_name(data[name_at : name_at + name_length].decode("ascii"))
        if dtype is None:
            raise _Refused
        tensors.append((dtype, pool[size_at : size_at + rank], grad == 1, first, count))
    items: dict[str, TensorItem | None] = {}
    for key_at, key_length, row in cscan.rows(tables["items"], 3):
        fqn = text(key_at, key_length)
        if row < 0:
            items[fqn] = None
            continue
        dtype, size, grad, first, count = tensors[row]
        if math.prod(size) >= MAX_ELEMENTS:
            raise _Refused
        boxes = []
        for c in range(first * 4, (first + count) * 4, 4):
            offsets_at, offsets_rank, sizes_at, sizes_rank = chunks[c : c + 4]
            boxes.append(checked_box(fqn, size, pool[offsets_at : offsets_at + offsets_rank],
                                     pool[sizes_at : sizes_at + sizes_rank]))
        items[fqn] = TensorItem(dtype, size, grad, boxes)
    storage: dict[ItemKey, StorageInfo] = {}
    for fqn_at, fqn_length, offset_at, rank, path_at, path_length, start, length in cscan.rows(tables["storage"], 8):
        storage[text(fqn_at, fqn_length), None if offset_at < 0 else pool[offset_at : offset_at + rank]] = \
            checked_info(text(path_at, path_length), start, length, None)
    version_at, version_length, has_planner = tables["header"].tolist()
    planner = None
    if has_planner:
        paths = tables["paths"].tolist()
        planner = {}
        for key_at, key_length, first, count in cscan.rows(tables["planner"], 4):
            path = tuple(text(paths[p + 1], paths[p + 2]) if paths[p] == 0 else paths[p + 1]
                         for p in range(first * 3, (first + count) * 3, 3))
            if not path:
                raise _Refused
            planner[text(key_at, key_length)] = path
    return DcpMetadata(items, planner, storage, text(version_at, version_length) if version_at >= 0 else None)

