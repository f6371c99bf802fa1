"""``model.safetensors``: a tree's tensors as one safetensors file, made of a computed header and the tensors'
bytes (``fs.pieces``: read from the source as they are stored wherever they can be).

The layout is the safetensors spec's: 8 bytes (little-endian u64) giving the
header's length, the header (UTF-8 JSON, padded with spaces so that the data
starts at a multiple of 8), then the data, every byte belonging to exactly one
tensor. Tensors are ordered by element size, largest first (each then starts at
a multiple of its own size), keeping the tree's order among equals.

Names are the tensor's keys below the file's directory joined with ``.``, as a
state dict's (str keys as they are, int keys in decimal, any other key as its
JSON). A tensor met at several paths (tied weights) is written at each path, its
own bytes each time, as safetensors requires. What safetensors cannot hold is
left out and listed (name and why) in ``__metadata__["left_out"]``, a JSON
text: tensors without data, quantized tensors, dtypes safetensors has no name
for (complex32, complex128, bits types), sparse and nested tensors, a
container met before (its tensors are at its first path), a name met twice, a
name that is not UTF-8. ``__metadata__`` also holds ``format`` (``pt``,
what transformers' loaders check for) and ``source`` (the checkpoint's path).
"""

from __future__ import annotations

import json
import struct
from itertools import accumulate, compress
from operator import attrgetter
from typing import Any, Callable, NamedTuple, Sequence

from ckptfs.errors import LimitExceededError
from ckptfs.formats.safetensors_file import DTYPE_NAMES, PACKED_F4
from ckptfs.fs.nest import Group
from ckptfs.fs.places import DictPairs
from ckptfs.fs.pieces import Literal, Piece, tensor_pieces
from ckptfs.model.dtypes import DType
from ckptfs.model.encoding import key_text
from ckptfs.model.jsontext import ascending_decimal_length, text_chunks
from ckptfs.model.records import Key, NestedTensor, SparseTensor, Tensor
from ckptfs.model.tree import is_container
from ckptfs.reading.extents import Extent

SAFETENSORS_NAME = "model.safetensors"
METADATA_KEY = "__metadata__"
MAX_HEADER_BYTES = 100_000_000
"""The safetensors loader refuses longer headers."""
class Members(NamedTuple):
    """Tensors and their names in a ``model.safetensors``: two lists of one length."""

    names: list[str]
    tensors: list[Tensor]


class LeftOut(NamedTuple):
    name: str
    reason: str


class Tree(NamedTuple):
    """What the member walk reads of a ``Layout``."""

    children: Callable[[Any], Sequence[tuple[Key, Any]]]
    """A container's ``(key, child)`` pairs."""
    is_first_place: Callable[[Any, Any, int], bool]
    """Whether ``(child, container, position)`` is the child's first place."""


def key_name(key: Key) -> str:
    if type(key) is str:
        return key
    if type(key) is int:
        return int.__repr__(key)
    return key_text(key)


def members(top: Any, tree: Tree) -> tuple[Members, list[LeftOut]]:
    """The tensors below container ``top`` with their names, in tree order, and what is left out."""
    found = Members([], [])
    left_out: list[LeftOut] = []
    seen = _Taken()
    stack: list[tuple[Any, str]] = [(top, "")]
    while stack:
        container, prefix = stack.pop()
        pairs = tree.children(container)
        if _all_members(pairs, prefix, found, seen):
            continue
        leaves = _group_leaves(pairs, prefix)
        if leaves is not None and _add_all(*leaves, "", True, found, seen):
            continue
        below: list[tuple[Any, str]] = []
        for position, (key, child) in enumerate(pairs):
            name = prefix + key_name(key)
            if isinstance(child, Tensor):
                reason = _unsupported(child, name, seen)
                if reason:
                    left_out.append(LeftOut(name, reason))
                else:
                    seen.add(name)
                    found.names.append(name)
                    found.tensors.append(child)
            elif isinstance(child, (SparseTensor, NestedTensor)):
                left_out.append(LeftOut(name, "sparse" if isinstance(child, SparseTensor) else "nested"))
            elif is_container(child) or isinstance(child, Group):
                if tree.is_first_place(child, container, position):
                    below.append((child, name + "."))
                else:
                    left_out.append(LeftOut(name, "a container met before: its tensors are at its first path"))
        stack.extend(reversed(below))
    return found, left_out


_DTYPE, _ITEMSIZE = attrgetter("dtype"), attrgetter("dtype.itemsize")
_HAS_DATA, _QUANTIZATION = attrgetter("has_data"), attrgetter("quantization")


BULK_MEMBERS = 64
"""Containers of fewer children are walked a child at a time: the checks of a whole container cost more there."""


class _Taken:
    """The names the members have taken so far: those added one at a time in a set, a whole container's added as
    its list, put in the set only when a name is checked against them (a state dict's one container of 200,000
    names never is)."""

    __slots__ = ("_set", "_lists")

    def __init__(self) -> None:
        self._set: set[str] = set()
        self._lists: list[list[str]] = []

    def add(self, name: str) -> None:
        self._set.add(name)

    def add_all(self, names: list[str]) -> None:
        """Adds distinct names none of which is taken yet."""
        self._lists.append(names)

    def _current(self) -> set[str]:
        while self._lists:
            self._set.update(self._lists.pop())
        return self._set

    def __contains__(self, name: str) -> bool:
        return name in (self._current() if self._lists else self._set)

    def isdisjoint(self, names: list[str]) -> bool:
        return not (self._set or self._lists) or self._current().isdisjoint(names)


def _all_members(pairs: Sequence[tuple[Key, Any]], prefix: str, found: Members, seen: _Taken) -> bool:
    """Adds the children as members when every one is a tensor safetensors holds under a str key (a state dict's
    every container), checked a column at a time (the loop in C); False (nothing added) for any other, which is
    then walked a child at a time."""
    if len(pairs) < BULK_MEMBERS:
        return False
    keys, tensors = (pairs.keys, pairs.values) if isinstance(pairs, DictPairs) else map(list, zip(*pairs))
    return _add_all(keys, tensors, prefix, isinstance(pairs, DictPairs), found, seen)


def _group_leaves(pairs: Sequence[tuple[Key, Any]], prefix: str) -> tuple[list[str], list[Any]] | None:
    """The tensors below a container's ``--nest`` directories (``Group``s) and beside them, in the walk's order (a
    directory's own tensors, then its directories'), each named by ``prefix`` and the key it was shown from; None
    unless a Group is among the children and every child below is a tensor or a Group, under a str key (a nested
    state dict's): they are then added in bulk. Their names are distinct: each is the key of one dict it was shown
    from, after the same prefix."""
    if not any(type(child) is Group for _, child in pairs):
        return None
    names: list[str] = []
    values: list[Any] = []
    stack = [(pairs, prefix)]
    while stack:
        level, at = stack.pop()
        groups = []
        for key, child in level:
            if type(key) is not str:
                return None
            if type(child) is Group:
                groups.append((child.pairs, f"{at}{key}."))
            elif type(child) is Tensor:
                names.append(at + key)
                values.append(child)
            else:
                return None
        stack.extend(reversed(groups))
    return names, values


def _add_all(keys: list[str], tensors: list[Any], prefix: str, distinct: bool, found: Members, seen: _Taken) -> bool:
    """``_all_members`` of ``keys`` (``distinct``: known to be) and their ``tensors``."""
    if set(map(type, tensors)) != {Tensor} or set(map(type, keys)) != {str}:
        return False
    names = [prefix + key for key in keys] if prefix else keys
    dtypes = list(map(_DTYPE, tensors))
    kinds = dict(zip(map(id, dtypes), dtypes)).values()
    # float4_e2m1fn_x2 is held but for its 0-d tensors, which only the walk a child at a time tells apart.
    if (any(_dtype_unsupported(dtype) or dtype.name == PACKED_F4 for dtype in kinds)
            or not all(map(_HAS_DATA, tensors)) or any(map(_QUANTIZATION, tensors)) or METADATA_KEY in names):
        return False
    # A dict's str keys are distinct, and so are they behind one prefix: no set of them to make.
    if not distinct and len(set(names)) != len(names) or not seen.isdisjoint(names):
        return False
    try:
        for chunk in text_chunks(len(names)):
            "".join(names[chunk]).encode("utf-8")
    except UnicodeEncodeError:
        return False
    seen.add_all(names)
    found.names.extend(names)
    found.tensors.extend(tensors)
    return True


def _by_itemsize(found: Members) -> Members:
    """The members ordered by element size, largest first, keeping their order among equals."""
    sizes = list(map(_ITEMSIZE, found.tensors))
    distinct = sorted(set(sizes), reverse=True)
    if len(distinct) <= 1:
        return found
    ordered = Members([], [])
    for size in distinct:  # a few: a pass over flags each, no int or index per member
        taken = [member_size == size for member_size in sizes]
        ordered.names.extend(compress(found.names, taken))
        ordered.tensors.extend(compress(found.tensors, taken))
    return ordered


def _unsupported(tensor: Tensor, name: str, seen: _Taken) -> str:
    """Why safetensors cannot hold this tensor under this name; empty if it can."""
    if not tensor.has_data:
        return "no data"
    if tensor.quantization is not None:
        return "quantized"
    reason = _dtype_unsupported(tensor.dtype)
    if reason:
        return reason
    if tensor.dtype.name == PACKED_F4 and not tensor.shape:
        return "a 0-d float4_e2m1fn_x2 has no safetensors shape"
    if name in seen:
        return "name met twice"
    if name == METADATA_KEY:
        return f"{METADATA_KEY} is the header's own"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "name not UTF-8"
    return ""


def _dtype_unsupported(dtype: DType) -> str:
    """Why safetensors cannot hold any tensor of this dtype; empty if it can."""
    if dtype.is_quantized:
        return "quantized"
    if dtype.name not in DTYPE_NAMES:
        return f"dtype {dtype.name}"
    return ""


def _all_utf8(left_out: list[LeftOut]) -> bool:
    try:
        for item in left_out:
            item.name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_MEMBER = ',{name}:{{"dtype":"{dtype}","shape":[{shape}],"data_offsets":[{start},{end}]}}'
"""A member's entry in the header (``name``: its JSON text)."""
_MEMBER_FIXED = len(_MEMBER.format(name="", dtype="", shape="", start="", end=""))


def _safetensors_shape(tensor: Tensor) -> list[int]:
    shape = list(tensor.shape)
    if tensor.dtype.name == PACKED_F4:
        shape[-1] *= 2
    return shape


class SafetensorsFile:
    """One ``model.safetensors``: its members, its size and pieces.

    A listing needs only the size: the header's length is computed from the members (per family of
    dtype and shape, the offsets' digits counted by bisection), and its text is made only when the file is read.
    """

    __slots__ = ("names", "tensors", "size", "header_length", "_head", "_header")

    def __init__(self, found: Members, left_out: list[LeftOut], source: str, max_bytes: int) -> None:
        self.names, self.tensors = _by_itemsize(found)
        # Names and paths that are not UTF-8 (undecodable bytes kept as surrogates) cannot be written as they are:
        # the path is shown with U+FFFD where its bytes are not UTF-8, and left-out names escaped as JSON escapes.
        metadata = {
            "format": "pt", "source": source.encode("utf-8", "surrogateescape").decode("utf-8", "replace"),
            "left_out": json.dumps([list(item) for item in left_out], ensure_ascii=not _all_utf8(left_out))}
        self._head = f'{{"{METADATA_KEY}":{json.dumps(metadata, ensure_ascii=False, separators=(",", ":"))}'
        self._header: bytes | None = None
        members_length, data_length = self._members_length()
        length = len(self._head.encode("utf-8")) + members_length + len("}")
        limit = min(max_bytes, MAX_HEADER_BYTES)
        if length > limit:
            raise LimitExceededError(f"{SAFETENSORS_NAME}'s header would exceed {limit} bytes")
        self.header_length = 8 + length + -length % 8
        """The header's bytes: its length's 8, the JSON text, the padding."""
        self.size = self.header_length + data_length

    def _members_length(self) -> tuple[int, int]:
        """The length in bytes of the members' entries in the header (``_MEMBER``s), and of their data."""
        # Members of one dtype and shape (a family) have entries as long but for their names and offsets.
        families: dict[tuple[str, tuple[int, ...]], int] = {}
        texts: list[int] = []
        sizes: list[int] = []
        length = total = 0
        for chunk in text_chunks(len(self.tensors)):  # a chunk at a time, this loop's lists and texts too
            ids = []
            for tensor in self.tensors[chunk]:
                key = (tensor.dtype.name, tensor.shape)
                family = families.get(key)
                if family is None:
                    family = families[key] = len(texts)
                    shape = ",".join(map(str, _safetensors_shape(tensor)))
                    texts.append(len(DTYPE_NAMES[tensor.dtype.name]) + len(shape))
                    sizes.append(tensor.nbytes)
                ids.append(family)
            # JSON escapes a name a character at a time: the names' texts are as long as the text of them all joined.
            names = "".join(self.names[chunk])
            length += (_MEMBER_FIXED + 2) * len(ids) + len(json.dumps(names, ensure_ascii=False).encode("utf-8")) - 2
            length += sum(map(texts.__getitem__, ids))
            offsets = list(accumulate(map(sizes.__getitem__, ids), initial=total))
            total = offsets[-1]
            length += ascending_decimal_length(offsets[:-1]) + ascending_decimal_length(offsets[1:])
        return length, total

    @property
    def header(self) -> bytes:
        """The header's bytes, made on first use: ``header_length`` of them."""
        if self._header is None:
            self._header = self._make_header()
        return self._header

    def _make_header(self) -> bytes:
        parts = [self._head]
        offset = 0
        for name, tensor in zip(self.names, self.tensors):
            nbytes = tensor.nbytes
            parts.append(_MEMBER.format(name=json.dumps(name, ensure_ascii=False), dtype=DTYPE_NAMES[tensor.dtype.name],
                                        shape=",".join(map(str, _safetensors_shape(tensor))), start=offset,
                                        end=offset + nbytes))
            offset += nbytes
        parts.append("}")
        text = "".join(parts).encode("utf-8")
        del parts
        return struct.pack("<Q", self.header_length - 8) + text + b" " * (self.header_length - 8 - len(text))

    def pieces(self, extents: Callable[[Tensor], list[Extent] | None]) -> list[Piece]:
        pieces: list[Piece] = [Literal(self.header)]
        for tensor in self.tensors:
            if tensor.nbytes:
                pieces += tensor_pieces(tensor, extents(tensor))
        return pieces
