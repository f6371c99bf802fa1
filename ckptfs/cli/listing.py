"""What ``ckptfs ls`` prints: each tensor's file in the mount, its dtype, shape and size.

A tensor's file is named by the mount's own ``Layout`` (escapes, ``%root``,
``%#N``, shortened names …), so ``ls`` shows exactly the path a mount of the
same file has, whatever the naming rules are.
"""

from __future__ import annotations

from typing import Iterator

from ckptfs.checkpoint import Checkpoint
from ckptfs.fs.layout import Layout
from ckptfs.fs.nodes import Dir, Kind
from ckptfs.fs.pathtext import PathTexts
from ckptfs.model.jsontext import dumps, quote
from ckptfs.model.records import Tensor

PADDED_FILE_CHARS = 100
"""The file column is padded to its longest entry up to this many characters; longer files push their own row."""


def tensor_files(layout: Layout) -> dict[int, str]:
    """Each tensor's file relative to the mount root, by the ``id`` of its record.

    One pass over the mount's directories. A directory's path is spelled out
    only if it holds a tensor, once: a deep tree of empty containers costs
    its number of entries, not their depth times their number.
    """
    files: dict[int, str] = {}
    stack: list[Dir] = [layout.root]
    while stack:
        directory = stack.pop()
        folder: str | None = None
        for node in layout.children(directory):
            if isinstance(node, Dir):
                stack.append(node)
            elif node.kind is Kind.TENSOR:
                if folder is None:
                    folder = "" if directory is layout.root else layout.path_of(directory) + "/"
                files[id(node.value)] = folder + node.name
    return files


def listed(ck: Checkpoint, nest: bool = False) -> list[tuple[str, Tensor]]:
    """Every tensor with its file in the mount (``nest``: in a ``--nest`` mount), in the checkpoint's order."""
    files = tensor_files(Layout(ck, nest=nest))
    return [(files[id(tensor)], tensor) for tensor in ck.tensors]


def human_size(nbytes: int) -> str:
    size = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024:
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} PiB"


def shape_text(tensor: Tensor) -> str:
    return "x".join(map(str, tensor.shape)) or "scalar"


def text_lines(rows: list[tuple[str, Tensor]]) -> Iterator[str]:
    """``FILE  DTYPE  SHAPE  SIZE`` lines, columns aligned."""
    cells = [(file, tensor.dtype.name, shape_text(tensor), human_size(tensor.nbytes)) for file, tensor in rows]
    widths = [min(max((len(cell[i]) for cell in cells), default=0), PADDED_FILE_CHARS if i == 0 else 1 << 62)
              for i in range(3)]
    for file, dtype, shape, size in cells:
        yield f"{file:<{widths[0]}}  {dtype:<{widths[1]}}  {shape:<{widths[2]}}  {size}\n"


def json_lines(rows: list[tuple[str, Tensor]], max_path_bytes: int) -> Iterator[str]:
    """One JSON object a line: ``file``, ``path`` (the keys, as in the index), ``dtype``, ``shape``, ``nbytes``."""
    paths = PathTexts(max_path_bytes)
    for file, tensor in rows:
        yield (f'{{"file": {quote(file)}, "path": {paths.path_text(tensor.trail)}, '
               f'"dtype": {quote(tensor.dtype.name)}, "shape": {dumps(list(tensor.shape))}, '
               f'"nbytes": {tensor.nbytes}}}\n')
