"""``/.ckptfs/index.json``: every tensor and every other entry of the tree, a JSON object a line."""

from __future__ import annotations

import math
from operator import attrgetter
from typing import Any, Iterator, Protocol, Sequence

from ckptfs.checkpoint import Checkpoint
from ckptfs.errors import LimitExceededError
from ckptfs.fs.files import container_kind
from ckptfs.fs.names import INDEX_NAME
from ckptfs.fs.nodes import BULK_SIZES, Dir, Kind, Node, TensorChildren
from ckptfs.fs.npy import npy_dtype
from ckptfs.fs.pathtext import PathTexts
from ckptfs.fs.views import NPY_SUFFIX, SCALES_SUFFIX, SIDECAR_SUFFIX, ZERO_POINTS_SUFFIX
from ckptfs.fs.zarr import ZARR_DIR
from ckptfs.model.encoding import encode_leaf, key_text
from ckptfs.model.jsontext import ascending_decimal_length, dumps, plain_lengths, quote, scalar_text
from ckptfs.model.records import Tensor

INDEX_VERSION = 3
INLINE_VALUE_BYTES = 256
"""Value files up to this size have their value in the index too (longer ones: read the file)."""


class Tree(Protocol):
    """What the index reads of a ``Layout``."""

    checkpoint: Checkpoint
    boxed: bool
    root: Dir
    paths: PathTexts
    view_names: frozenset[str]

    def children(self, directory: Dir) -> Sequence[Node]: ...

    def value_size(self, value: Any) -> int: ...

    def safetensors_paths(self) -> list[str]: ...


def make_index(layout: Tree) -> bytearray:
    """One pre-order pass over the tree: tensors (in pickle order) and every other entry, a JSON object a line.

    Entries name their parent by id rather than repeating their key path, so
    the index grows with the number of entries, not with their depth. A
    tensor's ``path`` and ``file`` are spelled out: joined from texts made
    once per directory, not re-encoded key by key.
    """
    made = _head(layout)
    _write(layout, made)
    return made


def sized_index(layout: Tree, kept_up_to: int) -> tuple[int, bytearray | None]:
    """``len(make_index(layout))``, and the index itself where it is at most ``kept_up_to`` bytes; a longer one's
    lines are counted, not kept: a listing of ``/.ckptfs`` needs its size only (200,000 tensors make 60 MB)."""
    made = _Bounded(_head(layout), kept_up_to)
    _write(layout, made)
    return len(made), made.data


class _Bounded:
    """Stands for the index's bytearray: its bytes until they pass ``limit``, then their length only."""

    __slots__ = ("data", "length", "limit")

    def __init__(self, data: bytearray, limit: int) -> None:
        self.data: bytearray | None = data
        self.length, self.limit = len(data), limit

    def passes_bound(self, more: int) -> bool:
        return self.length + more > self.limit

    def count(self, more: int) -> None:
        """Counts ``more`` bytes past the bound (``passes_bound``), not kept."""
        self.length += more
        self.data = None

    def __iadd__(self, more: bytes | bytearray | memoryview) -> _Bounded:
        self.length += len(more)
        if self.data is not None:
            self.data += more
            if self.length > self.limit:
                self.data = None
        return self

    def __delitem__(self, last: slice) -> None:
        self.length -= len(range(self.length)[last])
        if self.data is not None:
            del self.data[last]

    def __len__(self) -> int:
        return self.length


def _write(layout: Tree, tensors: bytearray | _Bounded) -> None:
    """Adds the index after its head to ``tensors``."""
    ck = layout.checkpoint
    # Lines go straight into two buffers, the index itself (head and tensors) and the other entries.
    entries = bytearray()
    root_kind = {"kind": "dir"} if layout.boxed else container_kind(layout.root.value)
    entries += (dumps({"id": 0, "name": "", **root_kind}) + ",\n").encode()
    ids: dict[int, int] = {} if layout.boxed else {id(layout.root.value): 0}
    # A link's target is met before it, its id kept; a tensor is one only where a tensor has aliases (a dict of
    # 200,000 tensors would keep 200,000 ids for none).
    tensor_targets = ck.alias_count > 0
    next_id = 1
    budget = ck.limits.max_generated_bytes
    # Per open directory: its children, its id, and the names on the way to it.
    stack: list[tuple[Iterator[Node], int, list[str]]] = []
    lines = _TensorLines(layout)

    def enter(directory: Dir, directory_id: int, folders: list[str]) -> None:
        """Adds a directory's children to the walk, or counts their lines at once (``_TensorLines.length``) where the
        index is only counted: a directory of ``BULK_SIZES`` tensors or more, each at its first place, none an alias's
        target (a few lines cost less made than counted)."""
        nonlocal next_id
        children = layout.children(directory)
        if (isinstance(tensors, _Bounded) and isinstance(children, TensorChildren) and len(children) >= BULK_SIZES
                and not tensor_targets and 0 not in children.firsts):
            folder = dumps("".join(name + "/" for name in folders))[:-1]
            length = lines.length(children, next_id, directory_id, folder)
            if length is not None and tensors.passes_bound(length):
                tensors.count(length)
                next_id += len(children)
                if len(tensors) + len(entries) > budget:
                    raise LimitExceededError(f"{INDEX_NAME} would exceed {budget} bytes (limit max_generated_bytes)")
                return
        stack.append((iter(children), directory_id, folders))

    enter(layout.root, 0, [])
    last_folders, folder_text = [], '"'
    while stack:
        nodes, parent_id, folders = stack[-1]
        node = next(nodes, None)
        if node is None:
            stack.pop()
            continue
        if len(tensors) + len(entries) > budget:
            raise LimitExceededError(f"{INDEX_NAME} would exceed {budget} bytes (limit max_generated_bytes)")
        node_id, next_id = next_id, next_id + 1
        if node.kind is Kind.TENSOR and tensor_targets or isinstance(node, Dir):
            ids[id(node.value)] = node_id
        if node.kind is Kind.TENSOR:
            if folders is not last_folders:
                # JSON text without its closing quote: escaping is per character, so it joins with the name's.
                last_folders, folder_text = folders, dumps("".join(name + "/" for name in folders))[:-1]
            tensors += lines.line(node, node_id, parent_id, folder_text)
            continue
        line = f'{{"id": {node_id}, "parent": {parent_id}, "name": {quote(node.name)}'
        if not (layout.boxed and node.parent is layout.root):
            line += ', "key": ' + key_text(node.key)
        if isinstance(node, Dir):
            line += ", " + dumps(container_kind(node.value))[1:]
            enter(node, node_id, [*folders, node.name])
        elif node.kind is Kind.LINK:
            line += f', "kind": "link", "target": {ids[id(node.value)]}}}'
        else:
            value = node.value
            size = layout.value_size(value)
            shown = f'"value": {_value_text(value)}' if size <= INLINE_VALUE_BYTES else ""
            line += f', "kind": "value", "size": {size}{", " if shown else ""}{shown}}}'
        entries += (line + ",\n").encode()
    if ck.tensors:
        del tensors[-2:]
    tensors += b'\n],\n"entries": [\n'
    tensors += memoryview(entries)[:-2]
    tensors += b"\n]}\n"


def _value_text(value: Any) -> str:
    """``scalar_text(encode_leaf(value))``, quicker for the float a value most often is."""
    if type(value) is float and math.isfinite(value):
        return float.__repr__(value)
    return scalar_text(encode_leaf(value))


def _head(layout: Tree) -> bytearray:
    """The index's opening: what the checkpoint is, then the opening of its tensor list."""
    ck = layout.checkpoint
    head = {"ckptfs_index": INDEX_VERSION, "source": ck.path, "format": ck.format, "byteorder": ck.byteorder,
            "tensor_count": len(ck.tensors), "alias_count": ck.alias_count, "safetensors": layout.safetensors_paths(),
            "zarr": ZARR_DIR if "zarr" in layout.view_names else None}
    return bytearray(dumps(head)[:-1].encode() + b',\n"tensors": [\n')


_QUANTIZATION = attrgetter("quantization")


class _TensorLines:
    """A tensor's index line, with the texts shared between tensors (shapes, the views shown) made once."""

    def __init__(self, layout: Tree) -> None:
        views_shown = layout.view_names
        self.paths = layout.paths
        self.sidecar_shown, self.npy_shown = "json" in views_shown, "npy" in views_shown
        self.scales_shown, self.zero_points_shown = "q_scales" in views_shown, "q_zero_points" in views_shown
        self.shape_texts: dict[tuple[int, ...], str] = {}

    def length(self, children: TensorChildren, first_id: int, parent_id: int, folder_text: str) -> int | None:
        """``sum(len(self.line(node, ...)))`` of a directory's tensor nodes, numbered from ``first_id``, counted
        without making their lines (a state dict's 200,000 are ~60 MB); None where a line must be made (a quantized
        tensor's). A line is its family's (dtype, shape, kind, data: those of the first one made) but for its id, key
        path and name (once in its file, once in each view's path)."""
        tensors = children.values
        if any(map(_QUANTIZATION, tensors)):
            return None
        names = children.names
        quoted = plain_lengths(names) or [len(quote(name)) for name in names]
        paths = self.paths.lengths([tensor.trail for tensor in tensors])
        families: dict[tuple[Any, ...], tuple[int, int]] = {}
        total = ascending_decimal_length(range(first_id, first_id + len(tensors)))
        for position, (tensor, name_length, path_length) in enumerate(zip(tensors, quoted, paths)):
            family = (tensor.dtype, tensor.shape, tensor.kind, tensor.has_data)
            found = families.get(family)
            if found is None:
                names_in_line = 1 + self.sidecar_shown + bool(self.npy_shown and npy_dtype(tensor))
                node_id = first_id + position
                line = self.line(children[position], node_id, parent_id, folder_text)
                rest = len(line) - len(int.__repr__(node_id)) - path_length - names_in_line * name_length
                found = families[family] = (rest, names_in_line)
            total += found[0] + path_length + found[1] * name_length
        return total

    def line(self, node: Node, node_id: int, parent_id: int, folder_text: str) -> bytes:
        """``folder_text`` is the JSON text of the tensor's folder path, without its closing quote."""
        tensor: Tensor = node.value
        name = quote(node.name)[1:]
        shape = self.shape_texts.get(tensor.shape)
        if shape is None:
            shape = self.shape_texts[tensor.shape] = dumps(list(tensor.shape))
        quantization = tensor.quantization
        per_channel = quantization is not None and quantization.scales is not None
        # The views shown beside the tensor, by their paths (text up to the closing quote).
        beside = folder_text + name[:-1]
        views = (f'"sidecar": {beside}{SIDECAR_SUFFIX}", ' if self.sidecar_shown else "") + (
            f'"npy": {beside}{NPY_SUFFIX}", ' if self.npy_shown and npy_dtype(tensor) else "") + (
            f'"q_scales": {beside}{SCALES_SUFFIX}", ' if per_channel and self.scales_shown else "") + (
            f'"q_zero_points": {beside}{ZERO_POINTS_SUFFIX}", ' if per_channel and self.zero_points_shown else "")
        return (f'{{"id": {node_id}, "parent": {parent_id}, "path": {self.paths.path_text(tensor.trail)}, '
                f'"file": {folder_text}{name}, {views}"dtype": {quote(tensor.dtype.name)}, "shape": {shape}, '
                f'"nbytes": {tensor.nbytes}}},\n').encode()
