"""A torch.save ``data.pkl`` made into its tree from the compiled scanner's rows (``ckptfs.pickle.cscan``).

The rows stand for the calls the reference interpreter makes, in its order: each storage row is one persistent
load, whose id the scanner checked as ``storage_persistent_id`` does, made by the same ``_StorageTable.storage``;
each tensor row one ``_rebuild_tensor_v2``, whose checks the scanner made except those that need the storage's
dtype (untyped, and its size against the last element), made here.
Whatever would raise makes the reference parse instead (its error is the answer): ``load`` returns None and the
storage table is emptied.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ckptfs.errors import CkptfsError
from ckptfs.limits import Limits
from ckptfs.model.dtypes import DType, dtype_of_storage_class
from ckptfs.model.records import Storage, Tensor
from ckptfs.pickle import cscan

_UNSEEN: Any = object()


class _Refused(Exception):
    """The rows would not make what the reference makes."""


MakeStorages = Callable[[list[str], list[DType], list[str], Sequence[int], Sequence[int]], list[Storage]]
"""``_StorageTable.storages_of``: of each key, dtype, location, numel and the key's number (-1 where not decimal), its
storage."""


def load(data: bytes, make_storages: MakeStorages, forget: Callable[[], None], limits: Limits) -> dict[str, Any] | None:
    """The root dict, or None (``forget`` then empties the persistent loads' table) for the reference."""
    data = bytes(data)  # the same object when it is bytes already: the rows' strings are sliced from it
    rows = cscan.scan(data, limits)
    if rows is None:
        return None
    try:
        return _tree(data, rows, make_storages)
    except (_Refused, CkptfsError, UnicodeDecodeError):
        forget()
        return None


def _tree(data: bytes, rows: cscan.Scan, make_storages: MakeStorages) -> dict[str, Any]:
    # A class or location is one opcode's text, met again through the memo: known by its offset.
    known: dict[int, DType | None] = {}
    places: dict[int, str] = {}
    keys: list[str] = []
    dtypes: list[DType] = []
    locations: list[str] = []
    # Columns, not a tuple per storage: 200,000 tuples alive at once leave their memory's pools to the daemon.
    for class_at, class_length, key_at, key_length, location_at, location_length, _, _ in cscan.rows(
            rows.storages, cscan.STORAGE_FIELDS):
        dtype = known.get(class_at, _UNSEEN)
        if dtype is _UNSEEN:
            dtype = known[class_at] = dtype_of_storage_class(
                "torch", data[class_at : class_at + class_length].decode("ascii"))
        if dtype is None:
            raise _Refused
        location = places.get(location_at)
        if location is None:
            location = places[location_at] = data[location_at : location_at + location_length].decode("ascii")
        keys.append(data[key_at : key_at + key_length].decode("ascii"))
        dtypes.append(dtype)
        locations.append(location)
    fields = cscan.STORAGE_FIELDS
    storages = make_storages(keys, dtypes, locations, rows.storages[6::fields], rows.storages[7::fields])
    del keys, dtypes, locations
    pool = rows.pool
    shapes: dict[tuple[int, ...], tuple[int, ...]] = {}  # one tuple per distinct shape or stride: less memory
    intern = shapes.setdefault
    tensors = []
    for storage_row, offset, size_at, rank, stride_at, grad, has_elements, last in cscan.rows(
            rows.tensors, cscan.TENSOR_FIELDS):
        storage = storages[storage_row]
        dtype = storage.dtype
        if dtype.name == "untyped":
            raise _Refused
        # make_tensor's ceil((last + 1) / packing) * itemsize > nbytes, for the storage's own dtype (a zero itemsize
        # refuses where it would pass: the reference then runs).
        if has_elements and last >= storage.numel * dtype.packing:
            raise _Refused
        shape, stride = pool[size_at : size_at + rank], pool[stride_at : stride_at + rank]
        tensors.append(Tensor(dtype, intern(shape, shape), intern(stride, stride), offset, storage, grad == 1, False,
                              "dense"))
    root: dict[str, Any] = {}
    for key_at, key_length, tensor_row in cscan.rows(rows.items, cscan.ITEM_FIELDS):
        root[data[key_at : key_at + key_length].decode("utf-8", "surrogatepass")] = tensors[tensor_row]
    return root
