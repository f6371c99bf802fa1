"""The entries of a mounted tree: directories, files and links, each with its inode number."""

from __future__ import annotations

import enum
from array import array
from itertools import repeat
from operator import itemgetter
from typing import Any, Callable, Iterator, Sequence, overload

from ckptfs.fs.views import View, data_sizes
from ckptfs.model.records import Key, Tensor


SLOT_BITS = 3
"""A child's entry and its views have ``2 ** SLOT_BITS`` inode numbers (``fs.layout.SLOTS``)."""
_SLOT_MASK = (1 << SLOT_BITS) - 1
BULK_SIZES = 256
"""Directories (and windows of a listing) of this many entries or more have their plan and sizes made in bulk
(``listing_plan``, ``Dir.listed_sizes``): below it, a bulk pass's fixed cost is more than a node per entry costs."""


def listing_plan(values: list[Any], views: Sequence[View]) -> array[int]:
    """``Dir.plan`` of a container's children ``values``: each child's position times ``2 ** SLOT_BITS``, each
    tensor's followed by that plus the slot of each view shown beside it (``View.shown``, a view at a time)."""
    tensors = [value for value in values if isinstance(value, Tensor)]
    if len(tensors) < BULK_SIZES:
        shown: Iterator[tuple[bool, ...]] = iter([tuple([view.shows(tensor) for view in views]) for tensor in tensors])
    else:
        columns: list[list[bool] | bool] = []
        for view in views:
            column = view.shown(tensors)
            shown_by = column.count(True)
            columns.append(column if 0 < shown_by < len(column) else shown_by > 0)  # a view shown by all or none
        if len(tensors) == len(values) and not any(isinstance(column, list) for column in columns):
            return _rows_plan(len(values), [view.slot for view, column in zip(views, columns) if column])
        shown = (zip(*[repeat(column) if isinstance(column, bool) else column for column in columns]) if views
                 else iter([()] * len(tensors)))
    slots: dict[tuple[bool, ...], list[int]] = {}
    plan = array("I")
    for position, value in enumerate(values):
        code = position << SLOT_BITS
        plan.append(code)
        if isinstance(value, Tensor):
            flags = next(shown)
            found = slots.get(flags)
            if found is None:
                found = slots[flags] = [view.slot for view, flag in zip(views, flags) if flag]
            plan.extend([code | slot for slot in found])
    return plan


class RowsPlan(array):  # type: ignore[type-arg]
    """A plan in rows: each child followed by the views of the same ``slots`` (the first is 0, the child itself), so
    that entry ``i`` is child ``i // len(slots)``'s ``slots[i % len(slots)]``. A window's entries of one slot are then
    a slice of it, found without a pass over its codes (``Dir.listed_sizes``)."""

    __slots__ = ("slots",)
    slots: tuple[int, ...]


def _rows_plan(count: int, slots: list[int]) -> array[int]:
    """``listing_plan`` of ``count`` tensors beside each of which the views of ``slots`` are shown: a column of the
    plan at a time (each child's codes a row)."""
    width = 1 + len(slots)
    plan = RowsPlan("I", array("I", [0]) * (count * width))
    plan.slots = (0, *slots)
    for column, slot in enumerate(plan.slots):
        plan[column::width] = array("I", range(slot, (count << SLOT_BITS) + slot, 1 << SLOT_BITS))
    return plan


_NO_PLAN = array("I")


class Kind(enum.Enum):
    __hash__ = object.__hash__  # Enum's hashes the name in Python: listings look up a kind per entry

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

    __slots__ = ("entries", "head", "plan", "tail", "children", "made", "named")

    def __init__(self, ino: int, name: str, parent: Dir | None, key: Key, value: Any) -> None:
        super().__init__(ino, Kind.DIR, name, parent, key, value)
        self.entries: dict[str, Node] | None = None
        """Its own entries by name: children and the others below, not views."""
        # Empty until built, and head and tail most often after: shared, not one each (a --nest tree has ~69,000).
        self.head: Sequence[Node] = ()
        """Listed first (the root's ``.ckptfs``; every entry of a ``/.zarr`` directory)."""
        self.plan: array[int] = _NO_PLAN
        """Then each child and each of its views, in listing order: the child's position times ``SLOTS`` plus the
        view's slot (0: the child itself). Replaced whole, never changed in place."""
        self.tail: Sequence[Node] = ()
        """Listed last (``model.safetensors``)."""
        self.children: Sequence[Node] = ()
        """One node per child of the container, by position (``TensorChildren``: made when asked for)."""
        self.made: dict[int, Node] | None = None
        """Before ``entries`` are made: the children looked up one at a time, by position (``model.safetensors`` at
        -1), kept so that the full build reuses them (one node per entry whichever comes first)."""
        self.named: tuple[list[str], dict[str, int]] | None = None
        """Before ``entries`` are made: the children's names by position and their positions by name (``fs.lookup``)."""

    def listed(self, start: int, stop: int, by_slot: list[View | None]) -> list[Node]:
        """Entries ``start`` to ``stop`` of the listing (made: ``fs.layout``), views by their slot."""
        head, plan, children = self.head, self.plan, self.children
        found = list(head[start:stop])
        start, stop = max(start - len(head), 0), max(stop - len(head), 0)
        for code in plan[start:stop]:
            child = children[code >> SLOT_BITS]
            slot = code & ((1 << SLOT_BITS) - 1)
            found.append(ViewNode.beside(child, by_slot[slot]) if slot else child)  # type: ignore[arg-type]
        return found + list(self.tail[max(start - len(plan), 0) : max(stop - len(plan), 0)])

    def listed_columns(self, start: int, stop: int,
                       by_slot: list[View | None]) -> tuple[list[str], list[int], list[Kind]]:
        """The names, inode numbers and kinds of ``listed``'s entries, without a node per view."""
        head, plan, children = self.head[start:stop], self.plan, self.children
        names, inos, kinds = [n.name for n in head], [n.ino for n in head], [n.kind for n in head]
        start, stop = max(start - len(self.head), 0), max(stop - len(self.head), 0)
        if isinstance(children, TensorChildren):
            children.columns(plan[start:stop], by_slot, names, inos, kinds)
        for code in plan[start:stop] if not isinstance(children, TensorChildren) else ():
            child = children[code >> SLOT_BITS]
            slot = code & ((1 << SLOT_BITS) - 1)
            names.append(child.name + by_slot[slot].suffix if slot else child.name)  # type: ignore[union-attr]
            inos.append(child.ino + slot)
            kinds.append(child.kind if not slot else Kind.VIEW if child.kind is Kind.TENSOR else Kind.VIEW_LINK)
        tail = self.tail[max(start - len(plan), 0) : max(stop - len(plan), 0)]
        return names + [n.name for n in tail], inos + [n.ino for n in tail], kinds + [n.kind for n in tail]

    def listed_arrays(self, start: int, stop: int, views: Sequence[View],
                      by_kind: dict[Kind, int]) -> tuple[list[str], array[int], array[int]] | None:
        """``listed_columns`` with the inode numbers in an ``array("Q")`` and, for the kinds, each entry's value in
        ``by_kind`` in an ``array("I")``, made with numpy: for a window of a directory of tensors only
        (``TensorChildren``) between its head and its tail; else None."""
        children, first, last = self.children, start - len(self.head), stop - len(self.head)
        if not isinstance(children, TensorChildren) or not 0 <= first < last <= len(self.plan):
            return None
        return children.arrays(self.plan, first, last, views, by_kind)

    def listed_sizes(self, start: int, stop: int, by_slot: list[View | None], size: Callable[[Node], int]) -> list[int]:
        """The sizes of ``listed``'s entries without a node per view: each view's made in bulk (``View.sizes``), the
        tensors' too; ``size`` gives the others' (a view of a link is a link: to its target's path and suffix)."""
        plan = self.plan
        sizes = [size(node) for node in self.head[start:stop]]
        first, last = max(start - len(self.head), 0), max(stop - len(self.head), 0)
        found = self._sizes_grouped(first, last, by_slot, size)
        tail = self.tail[max(start - len(plan), 0) : max(stop - len(plan), 0)]
        return sizes + found + [size(node) for node in tail]

    def _sizes_grouped(self, first: int, last: int, by_slot: list[View | None],
                       size: Callable[[Node], int]) -> list[int]:
        plan = self.plan
        if type(plan) is RowsPlan:
            return self._sizes_in_rows(plan.slots, first, last, by_slot, size)
        groups: dict[int, tuple[list[int], list[int]]] = {}
        codes = self.plan[first:last]
        for index, code in enumerate(codes):
            group = groups.get(code & _SLOT_MASK)
            if group is None:
                group = groups[code & _SLOT_MASK] = ([], [])
            group[0].append(index)
            group[1].append(code >> SLOT_BITS)
        found = [0] * len(codes)
        for slot, (where, positions) in sorted(groups.items()):
            for index, made in zip(where, self._slot_sizes(positions, by_slot[slot], size)):
                found[index] = made
        return found

    def _sizes_in_rows(self, slots: tuple[int, ...], first: int, last: int, by_slot: list[View | None],
                       size: Callable[[Node], int]) -> list[int]:
        """``_sizes_grouped`` of a ``RowsPlan``: each slot's entries of the window a slice of it."""
        width, last = len(slots), min(last, len(self.plan))
        found = [0] * max(last - first, 0)
        for column, slot in enumerate(slots):
            start = first + (column - first) % width
            if start < last:
                positions = range(start // width, start // width + len(range(start, last, width)))
                found[start - first :: width] = self._slot_sizes(positions, by_slot[slot], size)
        return found

    def _slot_sizes(self, positions: Sequence[int], view: View | None, size: Callable[[Node], int]) -> list[int]:
        """The sizes of the children at ``positions`` (``view``: of that view of each)."""
        if isinstance(self.children, TensorChildren):
            return self.children.sizes(positions, view, size)
        nodes = _pick(self.children, positions)
        files = [node for node in nodes if node.kind is Kind.TENSOR]
        if view is None:  # the children themselves
            unknown = [node for node in files if node.size < 0]
            for node, nbytes in zip(unknown, data_sizes([node.value for node in unknown])):
                node.size = nbytes
            return [node.size if node.size >= 0 else size(node) for node in nodes]
        made = iter(view.sizes([node.value for node in files]))
        suffix_length = len(view.suffix.encode("utf-8"))
        return [next(made) if node.kind is Kind.TENSOR else size(node) + suffix_length for node in nodes]


class TensorChildren(Sequence[Node]):
    """The nodes of a container's children when all are tensors, each made when asked for and not kept: a file where
    it is first met (``firsts``), else a link (``Layout._node`` of each, without its checks). A state dict's
    directory holds 200,000: its names, pairs and a byte per child are all it keeps."""

    __slots__ = ("base", "directory", "firsts", "names", "pairs", "values")

    def __init__(self, directory: Dir, pairs: Sequence[tuple[Key, Any]], values: list[Any], names: list[str],
                 base: int, firsts: list[bool]) -> None:
        self.directory, self.pairs, self.values, self.names, self.base = directory, pairs, values, names, base
        self.firsts = bytes(firsts)

    @overload
    def __getitem__(self, position: int) -> Node: ...

    @overload
    def __getitem__(self, position: slice) -> list[Node]: ...

    def __getitem__(self, position: int | slice) -> Node | list[Node]:
        if isinstance(position, slice):
            return [self[i] for i in range(*position.indices(len(self.names)))]
        if position < 0:
            position += len(self.names)
        key, child = self.pairs[position]
        kind = Kind.TENSOR if self.firsts[position] else Kind.LINK
        return Node(self.base + (position << SLOT_BITS), kind, self.names[position], self.directory, key, child)

    def __len__(self) -> int:
        return len(self.names)

    def sizes(self, positions: Sequence[int], view: View | None, size: Callable[[Node], int]) -> list[int]:
        """``Dir.listed_sizes``' sizes of the children at ``positions`` (``view``: of that view of each), a node made
        only for a link (its size is its target's path's length)."""
        firsts, values = self.firsts, self.values
        if positions and positions[-1] - positions[0] == len(positions) - 1 and (
                0 not in firsts[positions[0] : positions[-1] + 1]):  # a run of files (positions ascend)
            files = values[positions[0] : positions[-1] + 1]
            return data_sizes(files) if view is None else view.sizes(files)
        files = [values[position] for position in positions if firsts[position]]
        made = iter(data_sizes(files) if view is None else view.sizes(files))
        suffix_length = 0 if view is None else len(view.suffix.encode("utf-8"))
        return [next(made) if firsts[position] else size(self[position]) + suffix_length for position in positions]

    def columns(self, codes: Sequence[int], by_slot: list[View | None], names: list[str], inos: list[int],
                kinds: list[Kind]) -> None:
        """``Dir.listed_columns`` of the entries ``codes`` of the plan, appended to ``names``, ``inos`` and ``kinds``,
        without a node."""
        if not codes:
            return
        own, firsts, base = self.names, self.firsts, self.base
        suffixes = [view.suffix if view is not None else "" for view in by_slot]
        names += [own[code >> SLOT_BITS] + suffixes[code & _SLOT_MASK] for code in codes]
        inos += [base + code for code in codes]
        files, links = _FILE_KINDS, _LINK_KINDS
        if 0 in firsts[codes[0] >> SLOT_BITS : (codes[-1] >> SLOT_BITS) + 1]:
            kinds += [(files if firsts[code >> SLOT_BITS] else links)[code & _SLOT_MASK] for code in codes]
        else:
            kinds += [files[code & _SLOT_MASK] for code in codes]

    def arrays(self, plan: array[int], start: int, stop: int, views: Sequence[View],
               by_kind: dict[Kind, int]) -> tuple[list[str], array[int], array[int]]:
        """``Dir.listed_arrays`` of the entries ``start`` to ``stop`` of ``plan``."""
        import numpy as np  # here: a command line that lists no big directory starts without it

        suffixes = [""] * (1 << SLOT_BITS)
        for view in views:
            suffixes[view.slot] = view.suffix
        own = self.names
        names = [own[code >> SLOT_BITS] + suffixes[code & _SLOT_MASK] for code in plan[start:stop]]
        codes = np.frombuffer(plan, dtype=f"u{plan.itemsize}")[start:stop]
        inos = codes.astype(np.uint64) + np.uint64(self.base)
        values = np.array([by_kind[kind] for kind in (*_FILE_KINDS, *_LINK_KINDS)], dtype=np.uint32)
        links = np.frombuffer(self.firsts, dtype=np.uint8)[codes >> SLOT_BITS] == 0
        found = values[(codes & _SLOT_MASK) | (links.astype(codes.dtype) << SLOT_BITS)]
        return names, array("Q", inos.tobytes()), array("I", found.tobytes())


_FILE_KINDS = [Kind.TENSOR] + [Kind.VIEW] * _SLOT_MASK
_LINK_KINDS = [Kind.LINK] + [Kind.VIEW_LINK] * _SLOT_MASK
"""A child's kind (slot 0) and its views' by slot, for a child shown at its first place and for a link."""


def _pick(items: Sequence[Node], positions: Sequence[int]) -> list[Node]:
    """``[items[p] for p in positions]``, the loop in C."""
    if len(positions) == 1:
        return [items[positions[0]]]
    return list(itemgetter(*positions)(items)) if positions else []
