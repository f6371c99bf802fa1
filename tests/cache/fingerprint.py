"""A checkpoint's whole object tree as plain nested tuples: types, values, and which objects are the same."""

from __future__ import annotations

import dataclasses
from typing import Any

from ckptfs.checkpoint import Checkpoint
from ckptfs.model.records import Quantization, Storage, Tensor
from ckptfs.pickle.values import Global


def fingerprint(ck: Checkpoint) -> tuple[Any, ...]:
    ids: dict[int, int] = {}
    return (ck.format, ck.byteorder, repr(sorted(ck.details.items())), _print(ck.root, ids),
            [_print(s, ids) for s in ck.storages], [(_print(t, ids), t.path) for t in ck.tensors])


def _print(value: Any, ids: dict[int, int]) -> Any:
    kind = type(value)
    if value is None or kind in (str, int, bool, bytes, complex):
        return kind.__name__, repr(value)
    if kind is float:
        return "float", value.hex()
    if kind is Global:
        return "Global", value.module, value.name
    if id(value) in ids:
        return "same as", ids[id(value)]
    ids[id(value)] = len(ids)
    number = ids[id(value)]
    if kind in (list, tuple):
        return kind.__name__, number, [_print(v, ids) for v in value]
    if kind is dict:
        return "dict", number, [(_print(k, ids), _print(v, ids)) for k, v in value.items()]
    if kind in (set, frozenset):
        return kind.__name__, number, sorted(repr(_print(v, {})) for v in value)
    if kind is bytearray:
        return "bytearray", bytes(value)
    if issubclass(kind, Storage):
        return ("Storage", number, value.key, value.dtype.name, value.location, value.numel, value.record,
                value.offset, value.size, value.byteorder, value.compressed, value.written, value.inline_data,
                _print(value.base, ids), value.base_offset, value.source is None)
    if issubclass(kind, Tensor):
        return ("Tensor", number, value.dtype.name, value.shape, value.stride, value.storage_offset,
                _print(value.storage, ids), value.requires_grad, value.is_parameter, value.kind, value.conj,
                value.neg, _print(value.quantization, ids), value.type_name, value.chunks)
    if kind is Quantization or dataclasses.is_dataclass(value):
        return kind.__name__, number, [(f.name, _print(getattr(value, f.name), ids))
                                       for f in dataclasses.fields(value)]
    return kind.__name__, number, repr(value)
