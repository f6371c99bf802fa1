"""The entries of a mounted tree: directories, files and links, each with its inode number."""

from __future__ import annotations

import enum
from array import array
from typing import Any, Callable

from ckptfs.fs.views import View, data_sizes
from ckptfs.model.records import Key


SLOT_BITS = 3
"""A child's entry and its views have ``2 ** SLOT_BITS`` inode numbers (``fs.layout.SLOTS``)."""
_SLOT_MASK = (1 << SLOT_BITS) - 1


class Kind(enum.Enum):
    DIR = "dir"
    TENSOR = "tensor"
    VIEW = "view"
    """A file beside a tensor's (its sidecar …): see ``fs.views``."""
    VALUE = "value"
    LINK = "link"
    VIEW_LINK = "view_link"
    """A view of a linked tensor: a link to that view of the tensor's file."""
    INDEX = "index"
    ZARR = "zarr"
    """A ``zarr.json`` below ``/.zarr`` (``fs.zarr``)."""
    ZARR_CHUNK = "zarr_chunk"
    """An array's chunk below ``/.zarr``: its tensor's bytes."""
    BUNDLE = "bundle"
    """A file of many tensors: a directory's ``model.safetensors`` (``fs.safetensors``)."""


class Node:
    """One entry of the mounted tree."""

    __slots__ = ("ino", "kind", "name", "parent", "key", "value", "size")

    def __init__(self, ino: int, kind: Kind, name: str, parent: Dir | None, key: Key, value: Any) -> None:
        self.ino = ino
        self.kind = kind
        self.name = name
        self.parent = parent
        self.key = key
        self.value = value
        """The container, tensor or value shown; for links the object linked to."""
        self.size = -1
        """Cached size in bytes, -1 until asked."""


class ViewNode(Node):
    """A view's file; ``value`` is its tensor."""

    __slots__ = ("view",)

    def __init__(self, ino: int, kind: Kind, name: str, parent: Dir | None, key: Key, value: Any, view: View) -> None:
        super().__init__(ino, kind, name, parent, key, value)
        self.view = view

    @staticmethod
    def beside(child: Node, view: View) -> ViewNode:
        """The view of a child tensor: its file, or a link to that view of the tensor's file if the child is a link."""
        kind = Kind.VIEW if child.kind is Kind.TENSOR else Kind.VIEW_LINK
        return ViewNode(child.ino + view.slot, kind, child.name + view.suffix, child.parent, child.key, child.value,
                        view)


class Dir(Node):
    """A directory; its entries are made the first time they are asked for.

    Views (``NAME.json`` …) are not kept: ``Layout`` makes their nodes as they are listed or looked up, from the
    tensor's node and ``plan``, so a directory of N tensors holds N nodes and ``4 N`` bytes of plan, not 3 N nodes.
    """

    __slots__ = ("entries", "head", "plan", "tail", "children")

    def __init__(self, ino: int, name: str, parent: Dir | None, key: Key, value: Any) -> None:
        super().__init__(ino, Kind.DIR, name, parent, key, value)
        self.entries: dict[str, Node] | None = None
        """Its own entries by name: children and the others below, not views."""
        self.head: list[Node] = []
        """Listed first (the root's ``.ckptfs``; every entry of a ``/.zarr`` directory)."""
        self.plan: array[int] = array("I")
        """Then each child and each of its views, in listing order: the child's position times ``SLOTS`` plus the
        view's slot (0: the child itself)."""
        self.tail: list[Node] = []
        """Listed last (``model.safetensors``)."""
        self.children: list[Node] = []
        """One node per child of the container, by position."""

    def listed(self, start: int, stop: int, by_slot: list[View | None]) -> list[Node]:
        """Entries ``start`` to ``stop`` of the listing (made: ``fs.layout``), views by their slot."""
        head, plan, children = self.head, self.plan, self.children
        found = head[start:stop]
        start, stop = max(start - len(head), 0), max(stop - len(head), 0)
        for code in plan[start:stop]:
            child = children[code >> SLOT_BITS]
            slot = code & ((1 << SLOT_BITS) - 1)
            found.append(ViewNode.beside(child, by_slot[slot]) if slot else child)  # type: ignore[arg-type]
        return found + self.tail[max(start - len(plan), 0) : max(stop - len(plan), 0)]

    def listed_columns(self, start: int, stop: int,
                       by_slot: list[View | None]) -> tuple[list[str], list[int], list[Kind]]:
        """The names, inode numbers and kinds of ``listed``'s entries, without a node per view."""
        head, plan, children = self.head[start:stop], self.plan, self.children
        names, inos, kinds = [n.name for n in head], [n.ino for n in head], [n.kind for n in head]
        start, stop = max(start - len(self.head), 0), max(stop - len(self.head), 0)
        for code in plan[start:stop]:
            child = children[code >> SLOT_BITS]
            slot = code & ((1 << SLOT_BITS) - 1)
            names.append(child.name + by_slot[slot].suffix if slot else child.name)  # type: ignore[union-attr]
            inos.append(child.ino + slot)
            kinds.append(child.kind if not slot else Kind.VIEW if child.kind is Kind.TENSOR else Kind.VIEW_LINK)
        tail = self.tail[max(start - len(plan), 0) : max(stop - len(plan), 0)]
        return names + [n.name for n in tail], inos + [n.ino for n in tail], kinds + [n.kind for n in tail]

    def listed_sizes(self, start: int, stop: int, by_slot: list[View | None], size: Callable[[Node], int]) -> list[int]:
        """The sizes of ``listed``'s entries without a node per view: each view's made in bulk (``View.sizes``), the
        tensors' too; ``size`` gives the others' (a view of a link is a link: to its target's path and suffix)."""
        plan, children = self.plan, self.children
        sizes = [size(node) for node in self.head[start:stop]]
        first, last = max(start - len(self.head), 0), max(stop - len(self.head), 0)
        codes = plan[first:last]
        found = [0] * len(codes)
        at_slot: list[list[int]] = [[] for _ in by_slot]
        for index, code in enumerate(codes):
            at_slot[code & _SLOT_MASK].append(index)
        owners = [[children[codes[index] >> SLOT_BITS] for index in indices] for indices in at_slot]
        files = [node for node in owners[0] if node.kind is Kind.TENSOR and node.size < 0]
        for node, nbytes in zip(files, data_sizes([node.value for node in files])):
            node.size = nbytes
        for index, node in zip(at_slot[0], owners[0]):
            found[index] = node.size if node.size >= 0 else size(node)
        for view, indices, nodes in zip(by_slot[1:], at_slot[1:], owners[1:]):
            if view is None or not indices:
                continue
            suffix_length = len(view.suffix.encode("utf-8"))
            shown = [(index, node.value) for index, node in zip(indices, nodes) if node.kind is Kind.TENSOR]
            for (index, _), view_size in zip(shown, view.sizes([tensor for _, tensor in shown])):
                found[index] = view_size
            for index, node in zip(indices, nodes):
                if node.kind is not Kind.TENSOR:
                    found[index] = size(node) + suffix_length
        tail = self.tail[max(start - len(plan), 0) : max(stop - len(plan), 0)]
        return sizes + found + [size(node) for node in tail]
