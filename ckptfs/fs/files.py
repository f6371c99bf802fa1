"""The contents of the files that show plain values, and what the index says of containers."""

from __future__ import annotations

import json
from typing import Any

from ckptfs.fs.nest import Group
from ckptfs.model.encoding import encode_leaf
from ckptfs.model.records import NestedTensor, SparseTensor
from ckptfs.pickle.values import PickledObject


def value_bytes(value: Any) -> bytes:
    """The contents of the file showing a non-tensor, non-container value."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, str):
        text = value
    elif value is None or isinstance(value, (bool, int, float)):
        try:
            text = repr(value)
        except ValueError:  # an int beyond Python's decimal conversion limit
            text = hex(value)
    else:
        text = json.dumps(encode_leaf(value), ensure_ascii=False)
    return (text + "\n").encode("utf-8", "surrogatepass")


def container_kind(value: Any) -> dict[str, Any]:
    if isinstance(value, Group):
        return {"kind": "nest", "prefix": value.prefix}
    if isinstance(value, dict):
        return {"kind": "dict"}
    if isinstance(value, list):
        return {"kind": "list"}
    if isinstance(value, tuple):
        return {"kind": "tuple"}
    if isinstance(value, SparseTensor):
        return {"kind": "sparse", "layout": value.layout, "size": list(value.size)}
    if isinstance(value, NestedTensor):
        return {"kind": "nested"}
    assert isinstance(value, PickledObject)
    return {"kind": "object", "class": value.class_name}
