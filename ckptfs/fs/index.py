"""``/.ckptfs/index.json``: every tensor and every other entry of the tree, a JSON object a line."""

from __future__ import annotations

from typing import Any, Iterator, Protocol

from ckptfs.checkpoint import Checkpoint
from ckptfs.errors import LimitExceededError
from ckptfs.fs.files import container_kind
from ckptfs.fs.names import INDEX_NAME
from ckptfs.fs.nodes import Dir, Kind, Node
from ckptfs.fs.npy import npy_dtype
from ckptfs.fs.pathtext import PathTexts
from ckptfs.fs.views import NPY_SUFFIX, SCALES_SUFFIX, SIDECAR_SUFFIX, ZERO_POINTS_SUFFIX
from ckptfs.fs.zarr import ZARR_DIR
from ckptfs.model.encoding import encode_leaf, key_text
from ckptfs.model.jsontext import dumps, quote, scalar_text
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

    def children(self, directory: Dir) -> list[Node]: ...

    def value_size(self, value: Any) -> int: ...

    def safetensors_paths(self) -> list[str]: ...


def make_index(layout: Tree) -> bytearray:
    """One pre-order pass over the tree: tensors (in pickle order) and every other entry, a JSON object a line.

    Entries name their parent by id rather than repeating their key path, so
    the index grows with the number of entries, not with their depth. A
    tensor's ``path`` and ``file`` are spelled out: joined from texts made
    once per directory, not re-encoded key by key. One function on purpose: its
    loop runs once per entry (hundreds of thousands), and the state it carries
    (open directories, their folder text, ids) is what each line is made from.
    """
    ck = layout.checkpoint
    views_shown = layout.view_names
    sidecar_shown, npy_shown = "json" in views_shown, "npy" in views_shown
    scales_shown, zero_points_shown = "q_scales" in views_shown, "q_zero_points" in views_shown
    budget = ck.limits.max_generated_bytes
    head = {"ckptfs_index": INDEX_VERSION, "source": ck.path, "format": ck.format, "byteorder": ck.byteorder,
            "tensor_count": len(ck.tensors), "alias_count": ck.alias_count, "safetensors": layout.safetensors_paths(),
            "zarr": ZARR_DIR if "zarr" in views_shown else None}
    # Lines go straight into two buffers, the index itself (head and tensors) and the other entries.
    tensors = bytearray(dumps(head)[:-1].encode() + b',\n"tensors": [\n')
    entries = bytearray()
    root_kind = {"kind": "dir"} if layout.boxed else container_kind(layout.root.value)
    entries += (dumps({"id": 0, "name": "", **root_kind}) + ",\n").encode()
    ids: dict[int, int] = {} if layout.boxed else {id(layout.root.value): 0}
    next_id = 1
    # Per open directory: its children, its id, and the names on the way to it.
    stack: list[tuple[Iterator[Node], int, list[str]]] = [(iter(layout.children(layout.root)), 0, [])]
    last_folders, folder_text = stack[0][2], '"'
    shape_texts: dict[tuple[int, ...], str] = {}
    while stack:
        nodes, parent_id, folders = stack[-1]
        node = next(nodes, None)
        if node is None:
            stack.pop()
            continue
        kind = node.kind
        if len(tensors) + len(entries) > budget:
            raise LimitExceededError(f"{INDEX_NAME} would exceed {budget} bytes (limit max_generated_bytes)")
        node_id, next_id = next_id, next_id + 1
        if kind is Kind.TENSOR or isinstance(node, Dir):
            ids[id(node.value)] = node_id
        if kind is Kind.TENSOR:
            tensor: Tensor = node.value
            if folders is not last_folders:
                # JSON text without its closing quote: escaping is per character, so it joins with the name's.
                last_folders, folder_text = folders, dumps("".join(name + "/" for name in folders))[:-1]
            name = quote(node.name)[1:]
            shape = shape_texts.get(tensor.shape)
            if shape is None:
                shape = shape_texts[tensor.shape] = dumps(list(tensor.shape))
            quantization = tensor.quantization
            per_channel = quantization is not None and quantization.scales is not None
            # The views shown beside the tensor, by their paths (text up to the closing quote).
            beside = folder_text + name[:-1]
            views = (f'"sidecar": {beside}{SIDECAR_SUFFIX}", ' if sidecar_shown else "") + (
                f'"npy": {beside}{NPY_SUFFIX}", ' if npy_shown and npy_dtype(tensor) else "") + (
                f'"q_scales": {beside}{SCALES_SUFFIX}", ' if per_channel and scales_shown else "") + (
                f'"q_zero_points": {beside}{ZERO_POINTS_SUFFIX}", ' if per_channel and zero_points_shown else "")
            tensors += (f'{{"id": {node_id}, "parent": {parent_id}, "path": {layout.paths.path_text(tensor.trail)}, '
                        f'"file": {folder_text}{name}, {views}"dtype": {quote(tensor.dtype.name)}, "shape": {shape}, '
                        f'"nbytes": {tensor.nbytes}}},\n').encode()
            continue
        line = f'{{"id": {node_id}, "parent": {parent_id}, "name": {quote(node.name)}'
        if not (layout.boxed and node.parent is layout.root):
            line += ', "key": ' + key_text(node.key)
        if isinstance(node, Dir):
            line += ", " + dumps(container_kind(node.value))[1:]
            stack.append((iter(layout.children(node)), node_id, [*folders, node.name]))
        elif kind is Kind.LINK:
            line += f', "kind": "link", "target": {ids[id(node.value)]}}}'
        else:
            size = layout.value_size(node.value)
            shown = f'"value": {scalar_text(encode_leaf(node.value))}' if size <= INLINE_VALUE_BYTES else ""
            line += f', "kind": "value", "size": {size}{", " if shown else ""}{shown}}}'
        entries += (line + ",\n").encode()
    if ck.tensors:
        del tensors[-2:]
    tensors += b'\n],\n"entries": [\n'
    tensors += memoryview(entries)[:-2]
    tensors += b"\n]}\n"
    return tensors
