"""A parsed object tree as flat tables: every value one entry of a typed table, containers as nodes whose
children are indices into the concatenation of those tables (see ``tree_decode`` for the layout).

Containers keep their identity (a value shared in the tree is one node referenced twice) and cycles through
mutable containers survive. A checkpoint holding something these tables do not describe (a type made by a
format that is not cached, a cycle through a tuple) raises :class:`NotCacheable` and is simply not cached.
"""

from __future__ import annotations

import struct
from operator import attrgetter
from typing import Any

import numpy as np

from ckptfs.cache.errors import NotCacheable
from ckptfs.cache.layout import (
    CATEGORY_BITS,
    CONSTANTS,
    MUTABLE_KINDS,
    NODE_KINDS,
    Category,
    Kind,
    Sections,
    pack_blob,
    pack_text,
)
from ckptfs.model.records import Quantization, Storage, Tensor
from ckptfs.sources import ByteSource

_QUANTIZATION = attrgetter("quantization")
INT64_MIN = -(1 << 63)
INT64_END = 1 << 63


class TreeEncoder:
    """Collects the tables of one checkpoint; ``ref`` gives a value's packed (local index, category)."""

    def __init__(self, source: ByteSource) -> None:
        self.source = source
        self.strings: dict[str, int] = {}
        self.ints: dict[int, int] = {}
        self.bigints: list[bytes] = []
        self.floats: dict[bytes, int] = {}
        self.complexes: list[complex] = []
        self.bytes_: dict[bytes, int] = {}
        self.bytearrays: list[bytes] = []
        self.storages: dict[int, int] = {}
        self.storage_list: list[Storage] = []
        self.tensors: dict[int, int] = {}
        self.tensor_list: list[Tensor] = []
        self.nodes: dict[int, int] = {}
        self.node_kinds: list[int] = []
        self.node_children: list[list[int]] = []
        self.build_order: list[int] = []
        self._open: set[int] = set()
        self._immutable_open: set[int] = set()
        self._pending: list[tuple[int, Any]] = []

    # -- leaves ------------------------------------------------------------------------------------------------

    def ref(self, value: Any) -> int:
        """The value's reference; a container not met before is queued to be encoded."""
        kind = type(value)
        if kind is str:
            return _pack(_intern(self.strings, value), Category.STR)
        if kind is Tensor:
            return _pack(self.tensor(value), Category.TENSOR)
        if value is None or kind is bool:
            return _pack(CONSTANTS.index(value), Category.CONST)
        if kind is int:
            if INT64_MIN <= value < INT64_END:
                return _pack(_intern(self.ints, value), Category.INT)
            self.bigints.append(value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True))
            return _pack(len(self.bigints) - 1, Category.BIGINT)
        if kind is float:
            return _pack(_intern(self.floats, struct.pack("<d", value)), Category.FLOAT)
        if kind is complex:
            self.complexes.append(value)
            return _pack(len(self.complexes) - 1, Category.COMPLEX)
        if kind is bytes:
            return _pack(_intern(self.bytes_, value), Category.BYTES)
        if kind is bytearray:
            self.bytearrays.append(bytes(value))
            return _pack(len(self.bytearrays) - 1, Category.BYTEARRAY)
        if kind is Storage:
            return _pack(self.storage(value), Category.STORAGE)
        node_kind = NODE_KINDS.get(kind)
        if node_kind is None:
            raise NotCacheable(f"a {kind.__name__} in the tree")
        return _pack(self._node(value, node_kind), Category.NODE)

    def refs(self, values: list[Any]) -> list[int]:
        """``[self.ref(value) for value in values]``; a column of strings (keys, locations, records) in one pass."""
        if set(map(type, values)) != {str}:
            return [self.ref(value) for value in values]
        table, category = self.strings, Category.STR
        intern = table.setdefault  # its default, the table's length before the call, is a new string's index
        return [(intern(value, len(table)) << CATEGORY_BITS) | category for value in values]

    def storage(self, storage: Storage) -> int:
        index = self.storages.get(id(storage))
        if index is None:
            if storage.source is not None and storage.source is not self.source:
                raise NotCacheable(f"storage {storage.key!r} is in another file")
            if storage.base is not None:
                self.storage(storage.base)
            index = self.storages[id(storage)] = len(self.storage_list)
            self.storage_list.append(storage)
        return index

    def tensor(self, tensor: Tensor) -> int:
        index = self.tensors.get(id(tensor))
        if index is None:
            if tensor.storage is not None:
                self.storage(tensor.storage)
            if tensor.quantization is not None:
                self._node(tensor.quantization, Kind.QUANT)
            index = self.tensors[id(tensor)] = len(self.tensor_list)
            self.tensor_list.append(tensor)
        return index

    # -- containers, encoded children first (post-order) without recursion --------------------------------------

    def _node(self, value: Any, kind: Kind) -> int:
        index = self.nodes.get(id(value))
        if index is not None:
            if index in self._immutable_open:
                raise NotCacheable("a cycle through an immutable container")
            return index
        index = self.nodes[id(value)] = len(self.node_kinds)
        self.node_kinds.append(kind)
        self.node_children.append([])
        if kind not in MUTABLE_KINDS:
            self._immutable_open.add(index)
        self._pending.append((index, value))
        return index

    def encode(self, root: Any) -> int:
        """Encodes the tree under ``root``; returns the root's reference."""
        root_ref = self.ref(root)
        stack: list[tuple[int, list[Any], int]] = []
        while self._pending or stack:
            if self._pending:
                index, value = self._pending.pop()
                leaves = self._state_dict_refs(value) if self.node_kinds[index] == Kind.DICT else None
                if leaves is not None:  # no container among its children: made at once
                    self.node_children[index] = leaves
                    self.build_order.append(index)
                    continue
                stack.append((index, _fields(value, self.node_kinds[index]), 0))
                continue
            index, fields, at = stack.pop()
            refs, ref, pending = self.node_children[index], self.ref, self._pending
            while at < len(fields):
                refs.append(ref(fields[at]))
                at += 1
                if pending:  # a container met for the first time: its children first
                    stack.append((index, fields, at))
                    break
            else:
                self._immutable_open.discard(index)
                self.build_order.append(index)
        return root_ref

    def _state_dict_refs(self, value: dict[Any, Any]) -> list[int] | None:
        """The references of a dict's keys and values, in ``_fields``' order, where its keys are strings and its
        values tensors without a quantization (a state dict's), in bulk; else None."""
        keys, tensors = list(value), list(value.values())
        if set(map(type, keys)) != {str} or set(map(type, tensors)) != {Tensor} or any(map(_QUANTIZATION, tensors)):
            return None
        tensor, category = self.tensor, Category.TENSOR
        tensor_refs = [(tensor(t) << CATEGORY_BITS) | category for t in tensors]
        return [ref for pair in zip(self.refs(keys), tensor_refs) for ref in pair]

    # -- the tables as sections ---------------------------------------------------------------------------------

    def counts(self) -> list[int]:
        return [len(CONSTANTS), len(self.strings), len(self.ints), len(self.bigints), len(self.floats),
                len(self.complexes), len(self.bytes_), len(self.bytearrays), len(self.storage_list),
                len(self.tensor_list), len(self.node_kinds)]

    def globalize(self, refs: list[int] | np.ndarray) -> np.ndarray:
        """Packed references as indices into the concatenated tables."""
        packed = np.asarray(refs, dtype=np.int64)
        bases = np.concatenate([[0], np.cumsum(self.counts())[:-1]]).astype(np.int64)
        return bases[packed & ((1 << CATEGORY_BITS) - 1)] + (packed >> CATEGORY_BITS)

    def sections(self) -> Sections:
        children = [ref for refs in self.node_children for ref in refs]
        return {
            "counts": np.asarray(self.counts(), dtype=np.int64),
            **pack_text("strings", list(self.strings)),
            "ints": np.fromiter(self.ints, dtype=np.int64, count=len(self.ints)),
            **pack_blob("bigints", self.bigints),
            "floats": np.frombuffer(b"".join(self.floats), dtype="<f8").astype(np.float64),
            "complexes": np.asarray([(c.real, c.imag) for c in self.complexes], dtype="<f8").reshape(-1),
            **pack_blob("bytes", list(self.bytes_)),
            **pack_blob("bytearrays", self.bytearrays),
            "node_kinds": np.asarray(self.node_kinds, dtype=np.int64),
            "node_ends": np.cumsum([len(refs) for refs in self.node_children], dtype=np.int64),
            "node_children": self.globalize(children),
            "build_order": np.asarray(self.build_order, dtype=np.int64),
        }


def _pack(local: int, category: Category) -> int:
    return (local << CATEGORY_BITS) | category


def _intern(table: dict[Any, int], value: Any) -> int:
    index = table.get(value)
    if index is None:
        index = table[value] = len(table)
    return index


def _fields(value: Any, kind: int) -> list[Any]:
    """A node's children in the order ``tree_decode`` expects them."""
    if kind in (Kind.LIST, Kind.TUPLE, Kind.SET, Kind.FROZENSET):
        return list(value)
    if kind == Kind.DICT:
        return [item for pair in value.items() for item in pair]
    if kind == Kind.GLOBAL:
        return [value.module, value.name]
    if kind == Kind.OBJECT:
        return [value.callable, value.args, value.kwargs, value.state, value.later_states, value.list_items,
                value.dict_items]
    if kind == Kind.UNHASHABLE:
        return [value.value]
    if kind == Kind.SPARSE:
        return [value.layout, value.size, value.components, value.is_coalesced]
    if kind == Kind.NESTED:
        return [value.components]
    if kind == Kind.NUMPY_ARRAY:
        return [value.dtype, value.shape, value.fortran_order, value.data]
    if kind == Kind.NUMPY_DTYPE:
        return [value.code, value.byteorder]
    assert isinstance(value, Quantization)
    return [value.scheme, value.scale, value.zero_point, value.axis, value.scales, value.zero_points]

