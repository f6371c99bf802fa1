"""What ``ckptfs ls`` prints: each tensor's file in the mount, its dtype, shape and size.

A tensor's file is named by the mount's own ``Layout`` (escapes, ``%root``,
``%#N``, shortened names …), so ``ls`` shows exactly the path a mount of the
same file has, whatever the naming rules are. A tensor is a distinct record,
listed at its first place; each other place holding the same record is an
alias, a link in a mount, listed right after it as ``b -> a``.
"""

from __future__ import annotations

from typing import Iterator, NamedTuple

from ckptfs.checkpoint import Checkpoint
from ckptfs.fs.layout import Layout
from ckptfs.fs.nest import Group
from ckptfs.fs.nodes import Dir, Kind, Node
from ckptfs.fs.pathtext import PathTexts
from ckptfs.model.encoding import key_text
from ckptfs.model.jsontext import dumps, quote
from ckptfs.model.records import Key, Tensor

PADDED_FILE_CHARS = 100
"""The file column is padded to its longest entry up to this many characters; longer files push their own row."""


class Row(NamedTuple):
    """One line of ``ls``: a tensor's file, or an alias's file and (``alias_of``) the tensor's."""

    file: str
    tensor: Tensor
    alias_of: str | None = None
    node: Node | None = None
    """An alias's link in the mount (its key path is spelled from it)."""


def tensor_files(layout: Layout) -> tuple[dict[int, str], dict[int, list[tuple[str, Node]]]]:
    """Each tensor's file relative to the mount root, by the ``id`` of its record; and each tensor's aliases
    (the links to its file: another place of the same record), by the same ``id``.

    One pass over the mount's directories. A directory's path is spelled out
    only if it holds a tensor, once: a deep tree of empty containers costs
    its number of entries, not their depth times their number.
    """
    files: dict[int, str] = {}
    aliases: dict[int, list[tuple[str, Node]]] = {}
    stack: list[Dir] = [layout.root]
    while stack:
        directory = stack.pop()
        folder: str | None = None
        for node in layout.children(directory):
            if isinstance(node, Dir):
                stack.append(node)
                continue
            tensor = node.kind is Kind.TENSOR
            if tensor or node.kind is Kind.LINK and isinstance(node.value, Tensor):
                if folder is None:
                    folder = "" if directory is layout.root else layout.path_of(directory) + "/"
                if tensor:
                    files[id(node.value)] = folder + node.name
                else:
                    aliases.setdefault(id(node.value), []).append((folder + node.name, node))
    return files, aliases


def listed(ck: Checkpoint, nest: bool = False) -> list[Row]:
    """Every tensor with its file in the mount (``nest``: in a ``--nest`` mount), in the checkpoint's order, each
    followed by its aliases in the mount's order."""
    files, aliases = tensor_files(Layout(ck, nest=nest))
    if not aliases:
        return [Row(files[id(tensor)], tensor) for tensor in ck.tensors]
    rows: list[Row] = []
    for tensor in ck.tensors:
        file = files[id(tensor)]
        rows.append(Row(file, tensor))
        rows.extend(Row(alias, tensor, file, node) for alias, node in sorted(aliases.get(id(tensor), ()),
                                                                              key=lambda pair: pair[1].ino))
    return rows


def alias_keys(node: Node) -> list[Key]:
    """The exact key path of a place in the mount (``--nest``'s directories are parts of dotted keys, no keys)."""
    keys: list[Key] = []
    key: Key = node.key
    parent = node.parent
    while parent is not None:
        if isinstance(parent.value, Group):  # the innermost group's prefix is the whole key's beginning
            key = f"{parent.value.prefix}.{key}"
            while parent is not None and isinstance(parent.value, Group):
                parent = parent.parent
            assert parent is not None
        keys.append(key)
        key, parent = parent.key, parent.parent
    return keys[::-1]


def human_size(nbytes: int) -> str:
    size = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024:
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} PiB"


def shape_text(tensor: Tensor) -> str:
    return "x".join(map(str, tensor.shape)) or "scalar"


def text_lines(rows: list[Row]) -> Iterator[str]:
    """``FILE  DTYPE  SHAPE  SIZE`` lines (an alias's ``FILE -> TENSOR'S FILE``), columns aligned."""
    # A state dict's 200,000 tensors have a few dtypes and shapes: their cells are made once each.
    kinds: dict[tuple[str, tuple[int, ...], str], tuple[str, str, str]] = {}
    files, described = [], []
    for file, tensor, alias_of, _ in rows:
        files.append(file if alias_of is None else f"{file} -> {alias_of}")
        kind = (tensor.dtype.name, tensor.shape, tensor.kind)
        cells = kinds.get(kind)
        if cells is None:
            cells = kinds[kind] = (tensor.dtype.name, shape_text(tensor), human_size(tensor.nbytes))
        described.append(cells)
    file_width = min(max(map(len, files), default=0), PADDED_FILE_CHARS)
    dtype_width = max((len(cells[0]) for cells in kinds.values()), default=0)
    shape_width = max((len(cells[1]) for cells in kinds.values()), default=0)
    for file, (dtype, shape, size) in zip(files, described):
        yield f"{file:<{file_width}}  {dtype:<{dtype_width}}  {shape:<{shape_width}}  {size}\n"


def json_lines(rows: list[Row], max_path_bytes: int) -> Iterator[str]:
    """One JSON object a line: ``file``, ``path`` (the keys, as in the index), ``dtype``, ``shape``, ``nbytes``; an
    alias's also ``alias_of`` (its tensor's file)."""
    paths = PathTexts(max_path_bytes)
    for file, tensor, alias_of, node in rows:
        if node is None:
            path = paths.path_text(tensor.trail)
            alias = ""
        else:
            path = "[" + ", ".join(key_text(key) for key in alias_keys(node)) + "]"
            alias = f', "alias_of": {quote(alias_of or "")}'
        yield (f'{{"file": {quote(file)}, "path": {path}, '
               f'"dtype": {quote(tensor.dtype.name)}, "shape": {dumps(list(tensor.shape))}, '
               f'"nbytes": {tensor.nbytes}{alias}}}\n')
