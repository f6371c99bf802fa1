"""Every place of a checkpoint's tree as a mount shows it: the one walk that ``ls``, ``cat`` and ``diff`` share.

A tensor is a distinct record, shown as a file at its first place; every other
place holding the same record is an *alias*, a link to that file in a mount
(``b -> a``). A container met again is a link to its directory, the same way.
"""

from __future__ import annotations

from typing import Iterator, NamedTuple

from ckptfs.fs.layout import Layout
from ckptfs.fs.nodes import Dir, Kind, Node
from ckptfs.model.records import Key, Tensor


class Place(NamedTuple):
    """One entry of the tree: its file relative to the mount root, its exact key path, its node, and for a link
    (an alias, or a container met again) the file of the first place it links to."""

    file: str
    keys: tuple[Key, ...]
    node: Node
    target: str | None


def tree_places(layout: Layout, values: bool = False) -> Iterator[Place]:
    """Pre-order, in the mount's order: every tensor's file and every alias of one; with ``values``, also every
    directory, value file and link to a directory (the tree below a linked directory is walked at its first
    place only)."""
    firsts: dict[int, str] = {}
    stack: list[tuple[Iterator[Node], str, tuple[Key, ...]]] = [(iter(layout.children(layout.root)), "", ())]
    while stack:
        nodes, folder, keys = stack[-1]
        node = next(nodes, None)
        if node is None:
            stack.pop()
            continue
        file, node_keys = folder + node.name, (*keys, node.key)
        if isinstance(node, Dir):
            firsts[id(node.value)] = file
            if values:
                yield Place(file, node_keys, node, None)
            stack.append((iter(layout.children(node)), file + "/", node_keys))
        elif node.kind is Kind.TENSOR:
            firsts[id(node.value)] = file
            yield Place(file, node_keys, node, None)
        elif node.kind is Kind.LINK and (values or isinstance(node.value, Tensor)):
            target = firsts.get(id(node.value))
            yield Place(file, node_keys, node, target or layout.path_of(layout.node_of(node.value)))
        elif values and node.kind is Kind.VALUE:
            yield Place(file, node_keys, node, None)

def dotted_key(keys: tuple[Key, ...] | list[Key]) -> str:
    """A key path as a state dict spells it: ``model.layers.0.weight``."""
    return ".".join(str(key) for key in keys)
