"""The compiled scanner of torch.save ``data.pkl`` pickles (``_cscan.c``), zip central directories
(``_cscan_zip.c``) and DCP ``.metadata`` pickles (``_cscan_dcp.c``), loaded with ctypes.

Plain C with no Python.h, built by ``pip install`` when a C compiler is there (``setup.py``: an optional
extension) and skipped without one: ckptfs then runs the pure-Python interpreter, which stays the reference. The
scanner emits rows of int64 (storages, tensors, dict items and the sizes' and strides' items); it refuses, and
the reference then runs, on anything it does not reproduce exactly, errors included. ``CKPTFS_PICKLE_COMPILED=0``
(read once at import) leaves it unloaded.
"""

from __future__ import annotations

import ctypes
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ckptfs.compiled import load_extension
from ckptfs.limits import Limits
from ckptfs.pickle import unpickler

_HERE = Path(__file__).resolve().parent


class _Result(ctypes.Structure):
    _fields_ = [("end", ctypes.c_int64), ("pool", ctypes.c_void_p), ("pool_len", ctypes.c_int64),
                ("storages", ctypes.c_void_p), ("storage_rows", ctypes.c_int64),
                ("tensors", ctypes.c_void_p), ("tensor_rows", ctypes.c_int64),
                ("items", ctypes.c_void_p), ("item_rows", ctypes.c_int64)]


DCP_TABLES = ("header", "items", "tensors", "chunks", "planner", "paths", "storage", "pool", "direct", "shapes",
              "files", "dtypes")
DCP_WIDTHS = (4, 3, 7, 4, 4, 3, 8, 1, 11, 2, 2, 2)


class _DcpResult(ctypes.Structure):
    _fields_ = [("end", ctypes.c_int64), ("tables", ctypes.c_void_p * len(DCP_TABLES)),
                ("lens", ctypes.c_int64 * len(DCP_TABLES))]


_DONE = 0
STORAGE_FIELDS = 8
TENSOR_FIELDS = 8
ITEM_FIELDS = 3
DIRECTORY_FIELDS = 8
CD_HEADER_SIZE = 46


def _load_library() -> tuple[ctypes.CDLL | None, str]:
    """The built library and how ``--version`` names the path: why it is not used when it is not."""
    library, found = load_extension(_HERE, "_cscan", "CKPTFS_PICKLE_COMPILED", "scanner",
                                    ("cs_scan", "cs_free", "cs_directory", "cs_directory_keys", "cs_data_offsets",
                                     "cs_dcp", "cs_dcp_free"))
    if library is None:
        return None, f"pure Python ({found})"
    library.cs_scan.argtypes = [ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                ctypes.POINTER(_Result)]
    library.cs_scan.restype = ctypes.c_int
    library.cs_free.argtypes = [ctypes.POINTER(_Result)]
    library.cs_free.restype = None
    library.cs_directory.argtypes = [ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                     ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64)]
    library.cs_directory.restype = ctypes.c_int
    library.cs_directory_keys.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                                          ctypes.c_void_p]
    library.cs_directory_keys.restype = ctypes.c_int64
    library.cs_data_offsets.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                        ctypes.c_void_p]
    library.cs_data_offsets.restype = None
    library.cs_dcp.argtypes = [ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                               ctypes.POINTER(_DcpResult)]
    library.cs_dcp.restype = ctypes.c_int
    library.cs_dcp_free.argtypes = [ctypes.POINTER(_DcpResult)]
    library.cs_dcp_free.restype = None
    return library, f"compiled ({found})"


LIBRARY, PATH_NAME = _load_library()
ENABLED = LIBRARY is not None
"""Whether ``scan`` runs the compiled scanner (the tests switch it off to compare with the pure-Python path)."""


def active_path() -> str:
    """Which parse path opens torch.save zips and DCP ``.metadata`` pickles: ``compiled (…)`` or ``pure Python
    (why)``."""
    if not unpickler.FAST_PATHS:
        return "pure Python, the reference (CKPTFS_PICKLE_FAST_PATHS=0)"
    return PATH_NAME if ENABLED or LIBRARY is None else "pure Python (the compiled scanner switched off)"


@dataclass(frozen=True, slots=True)
class Scan:
    """The scanner's tables (see ``_cscan.h``), each its rows' int64s in a row (``rows`` iterates one); the pool
    as a tuple, to slice sizes and strides from."""

    end: int
    pool: tuple[int, ...]
    storages: memoryview
    tensors: memoryview
    items: memoryview


def rows(table: memoryview | array[int], width: int) -> Iterator[tuple[int, ...]]:
    """The rows of a table of ``width`` ints per row."""
    cursor = iter(table)
    return zip(*[cursor] * width)


def scan(data: bytes, limits: Limits) -> Scan | None:
    """The rows of ``data``, or None when the scanner is not there or refuses (the reference then parses)."""
    if LIBRARY is None or not ENABLED or not unpickler.FAST_PATHS or len(data) > limits.max_pickle_bytes:
        return None
    result = _Result()
    if LIBRARY.cs_scan(bytes(data), len(data), limits.max_memo_entries, limits.max_stack_depth,
                       ctypes.byref(result)) != _DONE:
        return None
    try:
        return Scan(result.end, tuple(_ints(result.pool, result.pool_len).tolist()),
                    _ints(result.storages, result.storage_rows * STORAGE_FIELDS),
                    _ints(result.tensors, result.tensor_rows * TENSOR_FIELDS),
                    _ints(result.items, result.item_rows * ITEM_FIELDS))
    finally:
        LIBRARY.cs_free(ctypes.byref(result))


def dcp(data: bytes, limits: Limits) -> dict[str, memoryview] | None:
    """A DCP ``.metadata`` pickle's tables (``_cscan.h``) by name, each its rows' int64s in a row, or None when the
    scanner is not there or refuses (the pure-Python paths then parse)."""
    if LIBRARY is None or not ENABLED or not unpickler.FAST_PATHS or len(data) > limits.max_pickle_bytes:
        return None
    result = _DcpResult()
    if LIBRARY.cs_dcp(data, len(data), limits.max_memo_entries, limits.max_stack_depth,
                      ctypes.byref(result)) != _DONE:
        return None
    try:
        return {name: _ints(result.tables[i], result.lens[i]) for i, name in enumerate(DCP_TABLES)}
    finally:
        LIBRARY.cs_dcp_free(ctypes.byref(result))


def directory(data: bytes, count: int, cd_offset: int) -> tuple[array[int], bool] | None:
    """A zip central directory's rows (``_cscan.h``) and whether its header offsets increase, or None when the
    scanner is not there or refuses (the Python loop then reads it)."""
    if LIBRARY is None or not ENABLED or not unpickler.FAST_PATHS or not 0 < count <= len(data) // CD_HEADER_SIZE:
        return None
    rows = array("q", bytes(count * DIRECTORY_FIELDS * 8))
    in_order = ctypes.c_int64()
    if LIBRARY.cs_directory(bytes(data), len(data), count, cd_offset, rows.buffer_info()[0],
                            ctypes.byref(in_order)) != _DONE:
        return None
    return rows, bool(in_order.value)


def directory_keys(data: bytes, rows: array[int], count: int) -> tuple[array[int], array[int]] | None:
    """Of ``directory``'s rows: the number of each storage record ``<prefix>data/<n>`` (-1 for other records) and
    the row of each number below ``count`` (-1 where none), or None where two records have one number."""
    assert LIBRARY is not None and len(rows) == count * DIRECTORY_FIELDS
    number_of_row, row_of_number = array("q", bytes(8 * count)), array("q", bytes(8 * count))
    if LIBRARY.cs_directory_keys(data, rows.buffer_info()[0], count, number_of_row.buffer_info()[0],
                                 row_of_number.buffer_info()[0]) < 0:
        return None
    return number_of_row, row_of_number


def data_offsets(rows: array[int], count: int, cd_offset: int, alignment: int) -> array[int]:
    """Each record's data offset by torch's rule, -1 where its place does not show torch's layout (rows in header
    offset order)."""
    assert LIBRARY is not None and len(rows) == count * DIRECTORY_FIELDS and alignment > 0
    offsets = array("q", bytes(8 * count))
    LIBRARY.cs_data_offsets(rows.buffer_info()[0], count, cd_offset, alignment, offsets.buffer_info()[0])
    return offsets


def _ints(address: int | None, count: int) -> memoryview:
    """A copy of the ``count`` int64s the scanner wrote (in the machine's own byte order)."""
    return memoryview(ctypes.string_at(address, count * 8) if count else b"").cast("q")
