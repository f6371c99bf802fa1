"""Where each tensor and container of a checkpoint's tree is first met, its containers' children and inode blocks.

One pre-order walk, children in pickle order, like ``tree.walk``: the first place found is the path
``Checkpoint`` gives a tensor; every later occurrence is shown as a link to it. Kept compact (a
container's number and a position packed in one int per object): a flat state dict of 200,000 tensors
holds 200,000 of them.
"""

from __future__ import annotations

import threading
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from operator import eq
from typing import Any, overload

from ckptfs.fs.nest import Group, nested
from ckptfs.model.records import Key, Tensor
from ckptfs.model.tree import CONTAINER_TYPES, children

POSITION_BITS = 32
"""A first place is ``container number << POSITION_BITS | position``: positions stay below ``max_tree_nodes``."""


class Places:
    """Each shared object's first place and each container's ``(key, child)`` pairs and first inode number."""

    __slots__ = ("nest", "_containers", "_first", "_tensor_first", "_pairs", "_block", "_holding_tensors", "_starts",
                 "_slots", "_met_once", "_unplaced", "_placing")

    def __init__(self, top: Any, first_block: int, slots: int, nest: bool = False, met_once: bool = False) -> None:
        """``top``: the root container; each container gets ``slots`` inode numbers per child from ``first_block``;
        ``nest``: dicts' dotted keys grouped into directories (``fs.nest``), which are containers here;
        ``met_once``: no tensor is met twice (``Checkpoint.alias_count`` is 0)."""
        self.nest = nest
        self._met_once = met_once
        self._unplaced: list[tuple[int, list[Any]]] = []
        """Containers of tensors only whose tensors' places are not in ``_tensor_first`` yet (``met_once``: where
        every place is a first one, those are made when one is asked for, not for a listing)."""
        self._placing = threading.Lock()
        """Held while those places are made: a mount's threads ask at once."""
        self._containers: list[Any] = []
        """Containers by number (the root's parent, None, is number 0)."""
        self._first: dict[int, int] = {}
        """Each container's first place, packed, by its id."""
        self._tensor_first: dict[Tensor, int] = {}
        """Each tensor's first place, packed, by the tensor (a record hashed by its identity: no int per key)."""
        self._pairs: dict[int, Sequence[tuple[Key, Any]]] = {}
        self._block: dict[int, int] = {}
        self._holding_tensors: set[int] = set()
        """The root's children holding a tensor (at its first place), by id: containers only (no tensor is asked)."""
        self._starts = array("Q")
        """Each container's first inode number, by number: blocks are handed out in that order."""
        self._slots = slots
        self._walk(top, first_block, slots)

    def _walk(self, top: Any, next_block: int, slots: int) -> None:
        containers, kids, block = self._containers, self._pairs, self._block
        containers.append(None)
        starts = self._starts
        starts.append(0)
        # Each entry: value, its parent's number, position, the root's child it is under (None for the root).
        stack: list[tuple[Any, int, int, Any]] = [(top, 0, 0, None)]
        while stack:
            value, parent, position, branch = stack.pop()
            is_tensor = isinstance(value, Tensor)
            first: dict[Any, int] = self._tensor_first if is_tensor else self._first  # type: ignore[assignment]
            key = value if is_tensor else id(value)
            if key in first:
                continue
            first[key] = parent << POSITION_BITS | position
            if not holds(value):
                if branch is not None and branch is not value:
                    self._holding_tensors.add(id(branch))
                continue
            number = len(containers)
            containers.append(value)
            pairs: Sequence[tuple[Key, Any]]
            if isinstance(value, Group):
                pairs = value.pairs
            elif type(value) is dict and not self.nest:
                pairs = DictPairs(value)
            else:
                pairs = nested(children(value)) if self.nest and isinstance(value, dict) else children(value)
            kids[id(value)] = pairs
            block[id(value)] = next_block
            starts.append(next_block)
            next_block += slots * len(pairs)
            values = pairs.values if isinstance(pairs, DictPairs) else [child for _, child in pairs]
            kinds = set(map(type, values))  # the children's few types, found in C: a state dict holds 200,000
            if not any(issubclass(kind, HOLDERS) for kind in kinds):
                self._leaves(values, number, branch, all(issubclass(kind, Tensor) for kind in kinds))
                continue
            for index in range(len(pairs) - 1, -1, -1):
                child = values[index]
                if (child not in self._tensor_first if isinstance(child, Tensor)
                        else holds(child) and id(child) not in self._first):
                    stack.append((child, number, index, child if number == 1 else branch))

    def _leaves(self, values: list[Any], number: int, branch: Any, tensors_only: bool) -> None:
        """``_walk`` for the children of container ``number`` when none is a container: they are met next, in order,
        so their tensors' first places are made in bulk (the loop in C: a state dict holds 200,000); the first of a
        tensor's places within them wins."""
        if tensors_only and self._met_once:
            self._unplaced.append((number, values))
            if values and branch is not None:
                self._holding_tensors.add(id(branch))
            return
        self._place(values, number, branch, tensors_only)

    def _place(self, values: list[Any], number: int, branch: Any, tensors_only: bool) -> None:
        base = number << POSITION_BITS
        if tensors_only:
            found = dict(zip(reversed(values), range(base + len(values) - 1, base - 1, -1)))
        else:
            found = {value: base | index for index, value in reversed(list(enumerate(values)))
                     if isinstance(value, Tensor)}
        for seen in found.keys() & self._tensor_first.keys():
            del found[seen]
        self._tensor_first.update(found)
        if found and branch is not None:
            self._holding_tensors.add(id(branch))

    def pairs(self, container: Any) -> Sequence[tuple[Key, Any]]:
        return self._pairs[id(container)]

    def block(self, container: Any) -> int:
        return self._block[id(container)]

    def place_of(self, ino: int) -> tuple[Any, int, int] | None:
        """The container whose block holds inode number ``ino``, the child's position there and the slot; None
        outside every block."""
        number = bisect_right(self._starts, ino) - 1
        if number < 1:
            return None
        container = self._containers[number]
        position, slot = divmod(ino - self._starts[number], self._slots)
        return (container, position, slot) if position < len(self._pairs[id(container)]) else None

    def first_place(self, value: Any) -> tuple[Any, int]:
        """The container holding a tensor or container where it is first met, and its position there."""
        packed = self._tensor_places()[value] if isinstance(value, Tensor) else self._first[id(value)]
        return self._containers[packed >> POSITION_BITS], packed & ((1 << POSITION_BITS) - 1)

    def is_first_place(self, child: Any, container: Any, position: int) -> bool:
        """Whether ``child`` is first met in ``container`` at ``position``, which holds it."""
        if self._met_once and isinstance(child, Tensor):
            return True
        holder, index = self.first_place(child)
        return index == position and holder is container

    def _tensor_places(self) -> dict[Tensor, int]:
        """``_tensor_first``, with the places of the tensors not placed yet (made by whichever thread asks first; the
        others wait for them)."""
        if self._unplaced:
            with self._placing:
                for number, values in self._unplaced:
                    self._place(values, number, None, True)
                self._unplaced = []
        return self._tensor_first

    def firsts_in(self, container: Any, values: list[Any]) -> list[bool]:
        """``[self.is_first_place(v, container, i) for i, v in enumerate(values)]`` for the container's children
        ``values``, tensors all, compared in one pass in C (a state dict holds 200,000)."""
        if self._met_once:
            return [True] * len(values)
        number = bisect_left(self._starts, self._block[id(container)])
        while self._containers[number] is not container:  # empty containers before it start where it does
            number += 1
        base = number << POSITION_BITS
        return list(map(eq, map(self._tensor_places().__getitem__, values), range(base, base + len(values))))

    def holds_tensors(self, top_child: Any) -> bool:
        """Whether a child of the root has a tensor below it at its first place."""
        return id(top_child) in self._holding_tensors


HOLDERS = (*CONTAINER_TYPES, Group)


def holds(value: Any) -> bool:
    """A container of the tree, or a directory made by ``--nest``."""
    return isinstance(value, HOLDERS)


class DictPairs(Sequence[tuple[Key, Any]]):
    """A dict's ``(key, child)`` pairs (``tree.children``'), as its keys and values in two lists: a pair is made when
    asked for, where a list of pairs holds a tuple per child (a state dict holds 200,000)."""

    __slots__ = ("keys", "values")

    def __init__(self, container: dict[Key, Any]) -> None:
        self.keys = list(container)
        self.values = list(container.values())

    @overload
    def __getitem__(self, index: int) -> tuple[Key, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[tuple[Key, Any]]: ...

    def __getitem__(self, index: int | slice) -> tuple[Key, Any] | list[tuple[Key, Any]]:
        if isinstance(index, slice):
            return list(zip(self.keys[index], self.values[index]))
        return self.keys[index], self.values[index]

    def __len__(self) -> int:
        return len(self.keys)

    def __iter__(self) -> Iterator[tuple[Key, Any]]:
        return zip(self.keys, self.values)
