"""The ``.metadata`` pickle of a torch.distributed.checkpoint directory, as plain records.

It is read by the restricted interpreter with no handlers: every class is an
inert ``PickledObject``, interpreted here by name (spec ``more-formats.md`` A.2).
``MetadataIndex`` keys become ``(fqn, offsets or None)``; pathlib and other
provenance globals are only reported.
"""

from __future__ import annotations

import math
from typing import Any

from ckptfs.errors import UnsupportedError
from ckptfs.formats import dcp_columns
from ckptfs.formats.dcp_records import (
    MAX_ELEMENTS,
    MAX_RANK,
    Box,
    DcpMetadata,
    ItemKey,
    StorageInfo,
    TensorItem,
    checked_box,
    checked_info,
    corrupt,
)
from ckptfs.limits import Limits
from ckptfs.model.dtypes import DType, dtype_by_name
from ckptfs.pickle.dcp_record import StorageKey, StorageRow, TensorRow
from ckptfs.pickle.unpickler import load_dcp
from ckptfs.pickle.values import Global, PickledObject, Row, UnhashableKey, short_repr

_MODULES = ("torch.distributed.checkpoint.", "torch.distributed._shard.checkpoint.")
"""DCP's modules, and torch 1.13's (``torch.distributed._shard.checkpoint``, DCP's predecessor: the same records
under other names, without ``storage_meta``, ``version`` and ``transform_descriptors``)."""
LEGACY_METADATA = "torch.distributed._shard.checkpoint.metadata.Metadata"


def _names(module: str, name: str) -> set[str]:
    return {prefix + module + "." + name for prefix in _MODULES}


METADATA = _names("metadata", "Metadata")
TENSOR_ITEM = _names("metadata", "TensorStorageMetadata")
BYTES_ITEM = _names("metadata", "BytesStorageMetadata")
CHUNK = _names("metadata", "ChunkStorageMetadata")
INDEX = _names("metadata", "MetadataIndex")
PROPERTIES = {*_names("metadata", "TensorProperties"),
              "torch.distributed._shard.sharded_tensor.metadata.TensorProperties"}
STORAGE_INFO = _names("filesystem", "_StorageInfo")


def parse_metadata(data: bytes, limits: Limits) -> DcpMetadata:
    """The records of one ``.metadata`` pickle: from the compiled scanner's rows where it accepts the pickle."""
    scanned = dcp_columns.metadata(data, limits)
    return parse_pickled(data, limits) if scanned is None else scanned


def parse_pickled(data: bytes, limits: Limits) -> DcpMetadata:
    """The records of one ``.metadata`` pickle, from the pure-Python paths' value."""
    root = load_dcp(data, limits)
    state = _state_of(root, METADATA, "the metadata")
    items = _mapping(state.get("state_dict_metadata"), "state_dict_metadata")
    version = state.get("version")
    return DcpMetadata(
        {_fqn(fqn): _row_item(fqn, item) if type(item) is TensorRow else _item(fqn, item)
         for fqn, item in items.items()},
        _planner_data(state.get("planner_data")),
        {_row_index(key) if type(key) is StorageKey else _index(key):
         checked_info(info.relative_path, info.offset, info.length, None) if type(info) is StorageRow
         else _storage_info(key, info) for key, info in _mapping(state.get("storage_data"), "storage_data").items()},
        version if isinstance(version, str) else None,
        root.class_name == LEGACY_METADATA,
    )


def _name(value: Any) -> str:
    if isinstance(value, (PickledObject, Row)):
        return value.class_name
    return value.qualname if isinstance(value, Global) else type(value).__name__


def _state_of(value: Any, names: set[str], what: str) -> dict[str, Any]:
    if not isinstance(value, PickledObject) or value.class_name not in names:
        raise corrupt(f"{what} is a {_name(value)}, not a {sorted(names)[0].rpartition('.')[2]}")
    state = value.state
    if isinstance(state, tuple) and len(state) == 2 and state[0] is None:  # (None, slots) of a slotted class
        state = state[1]
    if not isinstance(state, dict):
        raise corrupt(f"{what} has no attribute dict ({short_repr(state)})")
    return state


def _mapping(value: Any, what: str) -> dict[Any, Any]:
    if not isinstance(value, dict):
        raise corrupt(f"{what} is a {_name(value)}, not a dict")
    return value


def _fqn(value: Any) -> str:
    if not isinstance(value, str):
        raise corrupt(f"item name {short_repr(value)} is not a string")
    return value


def _size(value: Any, what: str) -> tuple[int, ...]:
    """A ``torch.Size`` (``REDUCE`` of a tuple of ints), or a plain tuple of ints."""
    if isinstance(value, PickledObject) and value.class_name == "torch.Size" and len(value.args) == 1:
        value = value.args[0]
    if not isinstance(value, (tuple, list)) or len(value) > MAX_RANK:
        raise corrupt(f"{what} is {short_repr(value)}, not a size")
    if not all(type(v) is int and 0 <= v < MAX_ELEMENTS for v in value):
        raise corrupt(f"{what} {short_repr(value)} has an entry that is not a non-negative int64")
    return tuple(value)


def _item(fqn: str, value: Any) -> TensorItem | None:
    if isinstance(value, PickledObject) and value.class_name in BYTES_ITEM:
        return None
    state = _state_of(value, TENSOR_ITEM, f"item {fqn!r}")
    size = _size(state.get("size"), f"size of {fqn!r}")
    if math.prod(size) >= MAX_ELEMENTS:
        raise corrupt(f"tensor {fqn!r} of size {list(size)} has more elements than int64 holds")
    dtype, requires_grad = _properties(fqn, state.get("properties"))
    chunks = state.get("chunks")
    if not isinstance(chunks, list):
        raise corrupt(f"chunks of {fqn!r} are a {_name(chunks)}, not a list")
    return TensorItem(dtype, size, requires_grad, [_box(fqn, size, chunk) for chunk in chunks])


def _row_item(fqn: str, row: TensorRow) -> TensorItem:
    """``_item``'s checks on a row (its sizes are non-negative int32s, at most 64 of them: no checks needed)."""
    size = row.size
    if math.prod(size) >= MAX_ELEMENTS:
        raise corrupt(f"tensor {fqn!r} of size {list(size)} has more elements than int64 holds")
    return TensorItem(_dtype(fqn, row.dtype), size, row.requires_grad,
                      [checked_box(fqn, size, offsets, sizes) for offsets, sizes in row.chunks])


def _properties(fqn: str, value: Any) -> tuple[DType, bool]:
    """The dtype and ``requires_grad`` of a ``TensorProperties``: a 5-tuple state, or a dict in older writers."""
    if not isinstance(value, PickledObject) or value.class_name not in PROPERTIES:
        raise corrupt(f"properties of {fqn!r} are a {_name(value)}, not TensorProperties")
    state = value.state
    if isinstance(state, tuple) and len(state) == 5:
        dtype, requires_grad = state[0], state[2]
    elif isinstance(state, dict):
        dtype, requires_grad = state.get("dtype"), state.get("requires_grad", False)
    else:
        raise corrupt(f"properties of {fqn!r} have the state {short_repr(state)}")
    return _dtype(fqn, dtype), requires_grad is True


def _dtype(fqn: str, dtype: Any) -> DType:
    known = dtype_by_name(dtype.name) if isinstance(dtype, Global) and dtype.module == "torch" else None
    if known is None:
        raise UnsupportedError(f"tensor {fqn!r} has the dtype {short_repr(dtype)}, which ckptfs does not know")
    return known


def _box(fqn: str, size: tuple[int, ...], value: Any) -> Box:
    state = _state_of(value, CHUNK, f"a chunk of {fqn!r}")
    return checked_box(fqn, size, _size(state.get("offsets"), f"chunk offsets of {fqn!r}"),
                        _size(state.get("sizes"), f"chunk sizes of {fqn!r}"))


def _index(key: Any) -> ItemKey:
    if isinstance(key, UnhashableKey):
        key = key.value
    state = _state_of(key, INDEX, "a storage_data key")
    fqn = _fqn(state.get("fqn"))
    offset = state.get("offset")
    return fqn, None if offset is None else _size(offset, f"the offset of {fqn!r} in storage_data")


def _row_index(key: StorageKey) -> ItemKey:
    return _fqn(key.fqn), key.offset


def _storage_info(key: Any, value: Any) -> StorageInfo:
    state = _state_of(value, STORAGE_INFO, "a storage_data value")
    return checked_info(state.get("relative_path"), state.get("offset"), state.get("length"),
                         state.get("transform_descriptors"))


def _planner_data(value: Any) -> dict[str, tuple[str | int, ...]] | None:
    if value is None:
        return None
    paths: dict[str, tuple[str | int, ...]] = {}
    for fqn, path in _mapping(value, "planner_data").items():
        if not isinstance(path, (tuple, list)) or not path or not all(
                type(k) is int or isinstance(k, str) for k in path):
            raise corrupt(f"planner_data path of {short_repr(fqn)} is {short_repr(path)}, not a key path")
        paths[_fqn(fqn)] = tuple(path)
    return paths
