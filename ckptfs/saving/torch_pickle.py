"""``data.pkl`` as ``torch.save`` writes it (protocol 2), from ckptfs's object tree, by a writer of its own.

Only what ``torch.load(weights_only=True)`` loads is written: dicts, lists,
tuples, tensors and parameters (``_rebuild_tensor_v2`` over typed storages,
persistent ids ``('storage', torch.FloatStorage, key, location, numel)``, or
``_rebuild_tensor_v3`` over ``UntypedStorage`` where torch has no typed class),
torch dtypes and devices, and plain leaves (int, float, str, bool, None,
bytes). Anything else is left out and listed by its dotted key: a dict entry
is dropped, a list or tuple item becomes None so the others keep their
positions. Tensors viewing one storage with its own element type stay tied
(one record, several rebuilds at their offsets); any other tensor gets a
record of its own holding its logical bytes, contiguous (chunked DCP tensors,
byte-swapped, conjugate or negative views…); so do tensors viewing an untyped
storage (torch's ``_rebuild_tensor_v3``), unless it is little-endian. An object met twice is written
once and then fetched from the memo, as pickle does.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Union

from ckptfs.errors import LimitExceededError
from ckptfs.fs.safetensors import LeftOut, key_name
from ckptfs.limits import Limits
from ckptfs.model.dtypes import DTYPES, UNTYPED, DType
from ckptfs.model.records import Tensor, Trail, contiguous_strides, path_of
from ckptfs.pickle.values import Global, PickledObject

TYPED_STORAGES = frozenset({"float64", "float32", "float16", "bfloat16", "complex128", "complex64", "int64", "int32",
                            "int16", "int8", "uint8", "bool"})
"""Element types torch saves through a typed storage class (``torch.FloatStorage``…); others go untyped."""
_BATCH = 1000
"""Items per SETITEMS or APPENDS, as pickle batches them."""


@dataclass(eq=False)
class Record:
    """One ``data/<key>`` record: a storage's bytes, given as a tensor whose logical bytes they are."""

    key: str
    dtype: DType
    location: str
    numel: int
    content: Tensor

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


@dataclass(eq=False)
class _Memoize:
    """After a tuple's items and its TUPLE opcode: the tuple goes to the memo."""

    value: tuple[Any, ...]


Step = Union[bytes, _Memoize, tuple[Any, Trail, int]]
"""What the writer does next: emit opcodes, memoize a finished tuple, or write a value found at a trail (its
path, kept as the model keeps paths: O(1) memory a node) and depth."""


class TorchPickler:
    """The pickle of ``root`` (``dump``), the storage records it refers to and what it left out."""

    def __init__(self, root: Any, limits: Limits = Limits()) -> None:
        self.root = root
        self.limits = limits
        self.records: list[Record] = []
        self.left_out: list[LeftOut] = []
        self._by_storage: dict[int, Record] = {}
        self._memo: dict[Any, int] = {}
        self._out = bytearray()

    def dump(self) -> bytes:
        """The whole pickle; written once (``records`` and ``left_out`` are then complete)."""
        self._out += b"\x80\x02"
        stack: list[Step] = [(self.root, None, 0)]
        open_tuples: set[int] = set()
        while stack:
            step = stack.pop()
            if isinstance(step, bytes):
                self._out += step
            elif isinstance(step, _Memoize):
                open_tuples.discard(id(step.value))
                self._put(id(step.value))
            else:
                value, trail, depth = step
                if id(value) in self._memo and isinstance(value, (dict, list, tuple, Tensor)):
                    self._get(id(value))
                elif id(value) in open_tuples:
                    self._leave_out(trail, "a tuple that contains itself")
                    self._out += b"N"
                elif depth > self.limits.max_tree_depth:
                    raise LimitExceededError(
                        f"object tree nests deeper than {self.limits.max_tree_depth} (limit max_tree_depth)")
                else:
                    if type(value) is tuple:
                        open_tuples.add(id(value))
                    stack.extend(reversed(self._value(value, trail, depth + 1)))
        self._out += b"."
        return bytes(self._out)

    def _value(self, value: Any, trail: Trail, depth: int) -> list[Step]:
        """Writes ``value``'s opening opcodes and gives the steps that complete it, in order (its children at
        ``depth``)."""
        kind = type(value)
        reason = _unwritable(value)
        if reason:
            self._leave_out(trail, reason)
            self._out += b"N"
        elif value is None:
            self._out += b"N"
        elif kind is bool:
            self._out += b"\x88" if value else b"\x89"
        elif kind is int:
            self._int(value)
        elif kind is float:
            self._out += b"G" + struct.pack(">d", value)
        elif kind is str:
            self._str(value)
        elif kind is bytes:
            self._global("_codecs", "encode")
            self._str(value.decode("latin-1"))
            self._str("latin1")
            self._out += b"\x86R"
        elif kind is Global and value.module == "torch.device":
            self._global("torch", "device")
            self._str(value.name)
            self._out += b"\x85R"
        elif kind is Global:
            self._global("torch", value.name)
        elif kind is dict:
            self._out += b"}"
            self._put(id(value))
            kept = [(key, child) for key, child in value.items() if self._keeps(key, child, (key, trail))]
            pairs = [step for key, child in kept for step in ((key, trail, depth), (child, (key, trail), depth))]
            return _batched(pairs, 2 * _BATCH, b"u")
        elif kind is list:
            self._out += b"]"
            self._put(id(value))
            return _batched([(child, (i, trail), depth) for i, child in enumerate(value)], _BATCH, b"e")
        elif kind is tuple:
            items: list[Step] = [(child, (i, trail), depth) for i, child in enumerate(value)]
            if len(value) <= 3:
                return [*items, b")\x85\x86\x87"[len(value):len(value) + 1], _Memoize(value)]
            return [b"(", *items, b"t", _Memoize(value)]
        else:
            self._tensor(value)
        return []

    def _keeps(self, key: Any, child: Any, trail: Trail) -> bool:
        """Whether a dict entry is written; one that is not is listed as left out."""
        reason = "a key torch cannot load" if not _is_key(key) else _unwritable(child)
        if reason:
            self._leave_out(trail, reason)
        return not reason

    def _leave_out(self, trail: Trail, reason: str) -> None:
        self.left_out.append(LeftOut(".".join(key_name(key) for key in path_of(trail)), reason))

    def _tensor(self, tensor: Tensor) -> None:
        """``_rebuild_tensor_v2`` over a typed storage, or ``_rebuild_tensor_v3`` over an untyped one and the dtype
        for element types without a typed storage class (uint16, float8…), as torch writes them."""
        record, offset, stride = self._record_of(tensor)
        typed = record.dtype.name in TYPED_STORAGES
        if tensor.is_parameter:
            self._global("torch._utils", "_rebuild_parameter")
        self._global("torch._utils", "_rebuild_tensor_v2" if typed else "_rebuild_tensor_v3")
        self._out += b"(("
        self._str("storage")
        if typed:
            self._global("torch", record.dtype.storage_class)
        else:
            self._global("torch.storage", "UntypedStorage")
        self._str(record.key)
        self._str(record.location)
        self._int(record.numel if typed else record.nbytes)
        self._out += b"tQ"
        self._int(offset)
        self._ints(tensor.shape)
        self._ints(stride)
        self._out += b"\x88" if tensor.requires_grad and not tensor.is_parameter else b"\x89"
        self._ordered_dict()
        if not typed:
            self._global("torch", tensor.dtype.name)
        self._out += b"tR"
        if tensor.is_parameter:
            self._out += b"\x88" if tensor.requires_grad else b"\x89"
            self._ordered_dict()
            self._out += b"\x87R"
        self._put(id(tensor))

    def _record_of(self, tensor: Tensor) -> tuple[Record, int, tuple[int, ...]]:
        """The record holding ``tensor``'s bytes, its offset there in elements and its stride."""
        storage = tensor.storage
        same_elements = storage is not None and (
            storage.dtype == tensor.dtype or (storage.dtype == UNTYPED and storage.byteorder == "little"))
        if storage is not None and same_elements and storage.base is None and not (tensor.conj or tensor.neg):
            record = self._by_storage.get(id(storage))
            if record is None:
                whole = Tensor(storage.dtype, (storage.numel,), (1,), 0, storage)
                record = self._new_record(storage.dtype, storage.location, storage.numel, whole)
                self._by_storage[id(storage)] = record
            return record, tensor.storage_offset, tensor.stride
        record = self._new_record(tensor.dtype, tensor.device, tensor.numel, tensor)
        return record, 0, contiguous_strides(tensor.shape)

    def _new_record(self, dtype: DType, location: str, numel: int, content: Tensor) -> Record:
        record = Record(str(len(self.records)), dtype, location, numel, content)
        self.records.append(record)
        return record

    def _ordered_dict(self) -> None:
        self._global("collections", "OrderedDict")
        self._out += b")R"

    def _global(self, module: str, name: str) -> None:
        key = ("global", module, name)
        if key in self._memo:
            self._get(key)
        else:
            self._out += b"c" + module.encode() + b"\n" + name.encode() + b"\n"
            self._put(key)

    def _put(self, key: Any) -> None:
        index = self._memo[key] = len(self._memo)
        self._out += b"q" + bytes([index]) if index < 256 else b"r" + struct.pack("<I", index)

    def _get(self, key: Any) -> None:
        index = self._memo[key]
        self._out += b"h" + bytes([index]) if index < 256 else b"j" + struct.pack("<I", index)

    def _int(self, value: int) -> None:
        if 0 <= value < 256:
            self._out += b"K" + bytes([value])
        elif 0 <= value < 65536:
            self._out += b"M" + struct.pack("<H", value)
        elif -(1 << 31) <= value < (1 << 31):
            self._out += b"J" + struct.pack("<i", value)
        else:
            encoded = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
            if len(encoded) < 256:
                self._out += b"\x8a" + bytes([len(encoded)]) + encoded
            else:
                self._out += b"\x8b" + struct.pack("<I", len(encoded)) + encoded

    def _ints(self, values: tuple[int, ...]) -> None:
        if not values:
            self._out += b")"
            return
        if len(values) > 3:
            self._out += b"("
        for value in values:
            self._int(value)
        self._out += b"t" if len(values) > 3 else b"\x85\x86\x87"[len(values) - 1:len(values)]

    def _str(self, value: str) -> None:
        encoded = value.encode("utf-8", "surrogatepass")
        self._out += b"X" + struct.pack("<I", len(encoded)) + encoded


def _batched(steps: list[Step], size: int, end: bytes) -> list[Step]:
    """``steps`` in MARK ... ``end`` groups of at most ``size`` steps (SETITEMS, APPENDS)."""
    out: list[Step] = []
    for start in range(0, len(steps), size):
        out += [b"(", *steps[start:start + size], end]
    return out


def _is_key(key: Any) -> bool:
    if type(key) is tuple:
        return all(_is_key(k) for k in key)
    return key is None or type(key) in (str, int, float, bool, bytes)


def _unwritable(value: Any) -> str:
    """Why ``value`` is left out; empty if it is written."""
    if value is None or type(value) in (bool, int, float, str, bytes, dict, list, tuple):
        return ""
    if type(value) is Global:
        if value.module == "torch.device" or (value.module == "torch" and value.name in DTYPES):
            return ""
        return f"a reference to {value.qualname}"
    if type(value) is Tensor:
        return _unwritable_tensor(value)
    if isinstance(value, PickledObject):
        return f"an object of {value.class_name}"
    return f"a {type(value).__name__}"


def _unwritable_tensor(tensor: Tensor) -> str:
    if tensor.kind != "dense":
        return "a tensor without data" if tensor.kind == "no_data" else f"a {tensor.kind} tensor"
    if tensor.type_name is not None:
        return f"a tensor of class {tensor.type_name}"
    if tensor.quantization is not None or tensor.dtype.is_quantized:
        return "a quantized tensor"
    if not tensor.has_data:
        return "a tensor without data"
    return ""
