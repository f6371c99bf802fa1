"""The vocabulary of a metadata cache entry: value categories, node kinds, dtype codes, and how string and
byte tables are packed into sections (arrays of int64 and blobs), and checked when read back."""

from __future__ import annotations

from enum import IntEnum
from typing import Any, Union

import numpy as np

from ckptfs.cache.errors import BadEntry, NotCacheable
from ckptfs.model.dtypes import DTYPES, UNTYPED, DType
from ckptfs.model.records import NestedTensor, Quantization, SparseTensor
from ckptfs.model.values import NumpyArray, NumpyDType
from ckptfs.pickle.values import Global, PickledObject, UnhashableKey

Section = Union[bytes, np.ndarray]
Sections = dict[str, Section]
"""Named parts of an entry's payload: raw bytes, or int64/float64 arrays."""

CONSTANTS = (None, True, False)
CATEGORY_BITS = 4


class Category(IntEnum):
    """The tables, in the order they are concatenated into the index space child references point into."""

    CONST = 0
    STR = 1
    INT = 2
    BIGINT = 3
    FLOAT = 4
    COMPLEX = 5
    BYTES = 6
    BYTEARRAY = 7
    STORAGE = 8
    TENSOR = 9
    NODE = 10


class Kind(IntEnum):
    LIST = 0
    TUPLE = 1
    DICT = 2
    SET = 3
    FROZENSET = 4
    GLOBAL = 5
    OBJECT = 6
    UNHASHABLE = 7
    SPARSE = 8
    NESTED = 9
    NUMPY_ARRAY = 10
    NUMPY_DTYPE = 11
    QUANT = 12


NODE_KINDS: dict[type, Kind] = {
    list: Kind.LIST, tuple: Kind.TUPLE, dict: Kind.DICT, set: Kind.SET, frozenset: Kind.FROZENSET,
    Global: Kind.GLOBAL, PickledObject: Kind.OBJECT, UnhashableKey: Kind.UNHASHABLE, SparseTensor: Kind.SPARSE,
    NestedTensor: Kind.NESTED, NumpyArray: Kind.NUMPY_ARRAY, NumpyDType: Kind.NUMPY_DTYPE, Quantization: Kind.QUANT,
}
"""Exact types only: a subclass (``LegacyTensor``…) is not cached."""
MUTABLE_KINDS = frozenset(NODE_KINDS.values()) - {Kind.TUPLE, Kind.FROZENSET, Kind.GLOBAL}
"""Kinds made empty before any node is filled, so that cycles through them can be restored."""

DTYPE_LIST: list[DType] = [UNTYPED, *DTYPES.values()]
_DTYPE_CODES = {id(d): i for i, d in enumerate(DTYPE_LIST)}


def dtype_code(dtype: DType) -> int:
    code = _DTYPE_CODES.get(id(dtype))
    if code is None:
        raise NotCacheable(f"dtype {dtype.name} is not one of ckptfs' own")
    return code


def pack_text(name: str, strings: list[str]) -> Sections:
    """Strings as one text (UTF-8, lone surrogates kept): joined by NUL when none holds one (split in C when
    read), else with the end of each, in characters."""
    joined = "".join(strings)
    if "\0" not in joined:
        text = "\0".join(strings).encode("utf-8", "surrogatepass")
        return {name: text, f"{name}_ends": np.asarray([-1], dtype=np.int64)}
    ends = np.cumsum([len(s) for s in strings], dtype=np.int64)
    return {name: joined.encode("utf-8", "surrogatepass"), f"{name}_ends": ends}


def unpack_text(sections: Sections, name: str, count: int) -> list[str]:
    try:
        text = blob(sections, name).decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        raise BadEntry(f"string table {name} is not UTF-8") from None
    marks = array(sections, f"{name}_ends")
    if len(marks) == 1 and marks[0] == -1:
        strings = text.split("\0") if count else []
    else:
        ends = ends_of(sections, f"{name}_ends", len(text))
        strings = [text[a:b] for a, b in zip([0, *ends[:-1]], ends)]
    if len(strings) != count:
        raise BadEntry(f"string table {name} holds {len(strings)} strings, not {count}")
    return strings


def pack_blob(name: str, items: list[bytes]) -> Sections:
    return {name: b"".join(items), f"{name}_ends": np.cumsum([len(b) for b in items], dtype=np.int64)}


def unpack_blob(sections: Sections, name: str) -> list[bytes]:
    data = blob(sections, name)
    ends = ends_of(sections, f"{name}_ends", len(data))
    starts = [0, *ends[:-1]]
    return [data[a:b] for a, b in zip(starts, ends)]


def ends_of(sections: Sections, name: str, total: int) -> list[int]:
    """Non-decreasing ends of consecutive parts of a table of ``total`` units, the last at its end."""
    ends = array(sections, name)
    if len(ends) and (ends[0] < 0 or bool(np.any(ends[1:] < ends[:-1])) or int(ends[-1]) != total):
        raise BadEntry(f"table {name} has bad bounds")
    if not len(ends) and total:
        raise BadEntry(f"table {name} has bytes but no parts")
    return ends.tolist()  # type: ignore[no-any-return]


def array(sections: Sections, name: str, length: int | None = None) -> np.ndarray:
    value = sections.get(name)
    if not isinstance(value, np.ndarray) or value.dtype != np.int64:
        raise BadEntry(f"section {name} is missing or not an integer array")
    if length is not None and len(value) != length:
        raise BadEntry(f"section {name} has {len(value)} entries, not {length}")
    return value


def floats(sections: Sections, name: str) -> np.ndarray:
    value = sections.get(name)
    if not isinstance(value, np.ndarray) or value.dtype != np.float64:
        raise BadEntry(f"section {name} is missing or not a float array")
    return value


def blob(sections: Sections, name: str) -> bytes:
    value = sections.get(name)
    if not isinstance(value, bytes):
        raise BadEntry(f"section {name} is missing or not bytes")
    return value


def checked_type(value: Any, kinds: tuple[type, ...], what: str) -> Any:
    """``value`` if its exact type is one of ``kinds`` (so a bool is not taken for an int)."""
    if type(value) not in kinds:
        raise BadEntry(f"{what} is a {type(value).__name__}")
    return value


def form_starts(ndim: np.ndarray) -> np.ndarray:
    """Where each tensor form's shape starts in ``form_dims``, its stride following (``records_codec``)."""
    return (np.cumsum(2 * ndim) - 2 * ndim).astype(np.int64)
