"""The object tree back from an entry's tables, every value's type and every reference checked.

Index space of references: constants (None, True, False), then strings, int64s, big ints, floats, complex
numbers, bytes, bytearrays, storages, tensors and nodes, each table after the other. Mutable nodes (lists,
dicts, objects …) are made empty first; then every node is filled, or made (tuples, frozensets, globals), in
the entry's build order, which puts children first: a node referring to a tuple not yet made is refused.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ckptfs.cache.chunks_codec import attach_chunks
from ckptfs.cache.errors import BadEntry
from ckptfs.cache.layout import (
    CONSTANTS,
    Category,
    Kind,
    Sections,
    array,
    checked_type,
    ends_of,
    floats,
    unpack_blob,
    unpack_text,
)
from ckptfs.cache.records_codec import attach_quantizations, decode_storages, decode_tensors
from ckptfs.limits import Limits
from ckptfs.model.records import NestedTensor, Quantization, SparseTensor, Storage, Tensor
from ckptfs.model.values import NumpyArray, NumpyDType
from ckptfs.pickle.values import Global, PickledObject, UnhashableKey, hashable_key
from ckptfs.sources import ByteSource


class _Unbuilt:
    """Stands for a tuple, frozenset or global not made yet."""


UNBUILT = _Unbuilt()
SIMPLE_KEYS = frozenset({str, int, float, bytes, bool, type(None), Global})
"""Key types ``hashable_key`` keeps as they are without hashing work."""
NONE = type(None)

_SHELLS: dict[int, Callable[[], Any]] = {
    Kind.LIST: list, Kind.DICT: dict, Kind.SET: set, Kind.OBJECT: lambda: PickledObject(None),
    Kind.UNHASHABLE: lambda: UnhashableKey(None), Kind.SPARSE: lambda: SparseTensor("", (), {}),
    Kind.NESTED: NestedTensor, Kind.NUMPY_ARRAY: NumpyArray, Kind.NUMPY_DTYPE: lambda: NumpyDType(""),
    Kind.QUANT: lambda: Quantization(""),
}
_ARITY = {Kind.GLOBAL: 2, Kind.OBJECT: 7, Kind.UNHASHABLE: 1, Kind.SPARSE: 4, Kind.NESTED: 1, Kind.NUMPY_ARRAY: 4,
          Kind.NUMPY_DTYPE: 2, Kind.QUANT: 6}


def decode_tree(sections: Sections, root_ref: int, source: ByteSource,
                limits: Limits) -> tuple[Any, list[Storage], list[Tensor]]:
    """The root object, every storage and every tensor of the entry, whose sizes are first held to the limits
    the parse would have held them to."""
    counts = array(sections, "counts", len(Category)).tolist()
    if (counts[Category.TENSOR] > limits.max_tensors or counts[Category.STORAGE] > limits.max_zip_entries
            or max(counts[Category.NODE], len(array(sections, "node_children"))) > limits.max_tree_nodes):
        raise BadEntry("entry describes more tensors, storages or tree nodes than the limits allow")
    objs: list[Any] = list(CONSTANTS)
    if counts[Category.CONST] != len(CONSTANTS):
        raise BadEntry("the constants table has another size")
    objs += unpack_text(sections, "strings", counts[Category.STR])
    strings = range(len(CONSTANTS), len(objs))
    objs += array(sections, "ints").tolist()
    objs += [int.from_bytes(b, "little", signed=True) for b in unpack_blob(sections, "bigints")]
    objs += floats(sections, "floats").tolist()
    pairs = floats(sections, "complexes").tolist()
    objs += [complex(pairs[i], pairs[i + 1]) for i in range(0, len(pairs) - 1, 2)]
    objs += unpack_blob(sections, "bytes")
    objs += map(bytearray, unpack_blob(sections, "bytearrays"))
    if len(pairs) % 2 or np.cumsum(counts[: Category.STORAGE]).tolist()[-1] != len(objs):
        raise BadEntry("the value tables have other sizes than the entry says")
    storages = decode_storages(sections, objs, counts[Category.STORAGE], source, strings)
    objs += storages
    tensors = decode_tensors(sections, objs, counts[Category.TENSOR], storages)
    attach_chunks(sections, objs, tensors, source)
    objs += tensors
    node_base = len(objs)
    kinds = array(sections, "node_kinds", counts[Category.NODE])
    if len(kinds) and (int(kinds.min()) < 0 or int(kinds.max()) >= len(Kind)):
        raise BadEntry("a node of unknown kind")
    kind_list = kinds.tolist()
    objs += [_SHELLS[k]() if k in _SHELLS else UNBUILT for k in kind_list]
    children = array(sections, "node_children")
    if len(children) and (int(children.min()) < 0 or int(children.max()) >= len(objs)):
        raise BadEntry("a node refers outside the tables")
    ends = ends_of(sections, "node_ends", len(children))
    if len(ends) != len(kind_list):
        raise BadEntry("the node table has another size than the entry says")
    order = array(sections, "build_order", len(kind_list))
    if not np.array_equal(np.sort(order), np.arange(len(kind_list))):
        raise BadEntry("the build order is not one of every node")
    child_list = children.tolist()
    starts = [0, *ends[:-1]]
    # Only a node with a node among its children can meet one not made yet.
    with_nodes = set(np.searchsorted(ends, np.flatnonzero(children >= node_base), side="right").tolist())
    for index in order.tolist():
        values = list(map(objs.__getitem__, child_list[starts[index] : ends[index]]))
        if index in with_nodes and UNBUILT in values:
            raise BadEntry("a node refers to a tuple, frozenset or global made after it")
        made = _fill(kind_list[index], objs[node_base + index], values)
        if made is not None:
            objs[node_base + index] = made
    attach_quantizations(sections, objs, tensors)
    for kind, node in zip(kind_list, objs[node_base:]):
        if kind == Kind.OBJECT and not all(type(p) is tuple and len(p) == 2 for p in node.dict_items):
            raise BadEntry("an object's dict items are not pairs")
    if not 0 <= root_ref < len(objs):
        raise BadEntry("the root refers outside the tables")
    return objs[root_ref], storages, tensors


def _fill(kind: int, node: Any, values: list[Any]) -> Any:
    """Fills a mutable node; returns an immutable one made of ``values``."""
    arity = _ARITY.get(kind)
    if arity is not None and len(values) != arity:
        raise BadEntry(f"a node of kind {Kind(kind).name} has {len(values)} fields")
    if kind == Kind.LIST:
        node.extend(values)
    elif kind == Kind.TUPLE:
        return tuple(values)
    elif kind == Kind.DICT:
        if len(values) % 2:
            raise BadEntry("a dict node has an odd number of keys and values")
        keys = values[0::2]
        _check_keys(keys)
        node.update(zip(keys, values[1::2]))
        if len(node) != len(keys):
            raise BadEntry("a dict node repeats a key")
    elif kind in (Kind.SET, Kind.FROZENSET):
        _check_keys(values)
        made = set(values) if kind == Kind.SET else frozenset(values)
        if len(made) != len(values):
            raise BadEntry("a set node repeats an element")
        if kind == Kind.FROZENSET:
            return made
        node.update(made)
    elif kind == Kind.GLOBAL:
        return Global(checked_type(values[0], (str,), "a global's module"), checked_type(values[1], (str,), "name"))
    elif kind == Kind.OBJECT:
        node.callable, node.args, node.kwargs, node.state, node.later_states, node.list_items, node.dict_items = values
        checked_type(node.args, (tuple,), "an object's arguments")
        checked_type(node.later_states, (list, NONE), "an object's later states")
        _checked_items(node.list_items, "an object's list items")
        _checked_items(node.dict_items, "an object's dict items")
    elif kind == Kind.UNHASHABLE:
        node.value = values[0]
    else:
        _fill_record(kind, node, values)
    return None


def _fill_record(kind: int, node: Any, values: list[Any]) -> None:
    if kind == Kind.SPARSE:
        node.layout, node.size, node.components, node.is_coalesced = values
        checked_type(node.layout, (str,), "a sparse layout")
        _check_dims(checked_type(node.size, (tuple,), "a sparse size"))
        checked_type(node.components, (dict,), "sparse components")
        checked_type(node.is_coalesced, (bool, NONE), "a sparse coalesced flag")
    elif kind == Kind.NESTED:
        node.components = checked_type(values[0], (dict,), "nested components")
    elif kind == Kind.NUMPY_ARRAY:
        node.dtype, node.shape, node.fortran_order, node.data = values
        checked_type(node.dtype, (str,), "a numpy dtype")
        _check_dims(checked_type(node.shape, (tuple,), "a numpy shape"))
        checked_type(node.fortran_order, (bool,), "a numpy order")
        checked_type(node.data, (bytes, NONE), "numpy data")
    elif kind == Kind.NUMPY_DTYPE:
        node.code = checked_type(values[0], (str,), "a numpy dtype code")
        node.byteorder = checked_type(values[1], (str,), "a numpy byte order")
    else:
        node.scheme, node.scale, node.zero_point, node.axis, node.scales, node.zero_points = values
        checked_type(node.scheme, (str,), "a quantization scheme")
        checked_type(node.scale, (float, NONE), "a quantization scale")
        checked_type(node.zero_point, (int, NONE), "a quantization zero point")
        checked_type(node.axis, (int, NONE), "a quantization axis")
        checked_type(node.scales, (Tensor, NONE), "quantization scales")
        checked_type(node.zero_points, (Tensor, NONE), "quantization zero points")


def _check_keys(keys: list[Any]) -> None:
    """Keys and set elements as the parse makes them: hashing each is bounded, or it is an UnhashableKey."""
    if set(map(type, keys)) <= SIMPLE_KEYS:
        return
    for key in keys:
        if hashable_key(key) is not key:
            raise BadEntry("a dict key or set element cannot be hashed in bounded time")


def _check_dims(dims: tuple[Any, ...]) -> None:
    if not all(type(d) is int and d >= 0 for d in dims):
        raise BadEntry("a shape holds other than non-negative integers")


def _checked_items(items: Any, what: str) -> None:
    """A list, or the empty tuple an object holds until its first item (``pickle.values.PickledObject``)."""
    if items != () or type(items) is not tuple:
        checked_type(items, (list,), what)
