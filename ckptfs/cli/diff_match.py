"""Which places of two checkpoints ``ckptfs diff`` pairs: the same exact key path, else the same dotted key.

Every place of each tree is taken as the mount shows it (``tree_places``):
each tensor's file, each alias of one, each value and container. Places are
paired by their exact key path, keys compared with their types (``0`` and
``'0'``, ``('a', 'b')`` and ``'a.b'`` are different places). Places left
unpaired are then paired by dotted key (``model.embed.weight``), when that key
names exactly one unpaired place on each side: a ``.pt`` nesting
``{"model": {...}}`` still meets a format that flattens its keys, and no two
places ever share one name. A container with children is reported only when
its kind differs from the other side's (dict, list, an object's class ...):
otherwise its contents tell.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ckptfs.checkpoint import Checkpoint
from ckptfs.cli.tree_places import Place, dotted_key, tree_places
from ckptfs.errors import LimitExceededError
from ckptfs.fs.files import container_kind
from ckptfs.fs.layout import Layout
from ckptfs.fs.nodes import Dir, Kind
from ckptfs.model.encoding import encode_key, encode_leaf
from ckptfs.model.records import Key, Tensor


@dataclass(slots=True)
class Entry:
    """One place of one side: a tensor (``tensor``), or any other value as its JSON encoding (``value``)."""

    file: str
    keys: tuple[Key, ...]
    tensor: Tensor | None
    value: Any
    alias_of: str | None
    """A tensor's alias (or a container met again): the file of its first place."""
    empty: bool = True
    """No container with children (one that is reported only through them when unpaired)."""

    @property
    def dotted(self) -> str:
        return dotted_key(self.keys)

    def path(self) -> list[Any]:
        return [encode_key(key) for key in self.keys]


def entries(ck: Checkpoint) -> list[Entry]:
    """Every place of ``ck``'s tree, in the mount's order (``max_tree_nodes`` bounds them)."""
    found: list[Entry] = []
    layout = Layout(ck, views=())
    for place in tree_places(layout, values=True):
        if len(found) >= ck.limits.max_tree_nodes:
            raise LimitExceededError(f"object tree has more than {ck.limits.max_tree_nodes} nodes "
                                     "(limit max_tree_nodes)", ck.path)
        found.append(_entry(layout, place))
    return found


def _entry(layout: Layout, place: Place) -> Entry:
    node = place.node
    if isinstance(node.value, Tensor):
        return Entry(place.file, place.keys, node.value, None, place.target)
    if place.target is not None:
        return Entry(place.file, place.keys, None, {"link": place.target}, place.target)
    if isinstance(node, Dir):
        return Entry(place.file, place.keys, None, container_kind(node.value), None,
                     empty=not layout.children(node))
    assert node.kind is Kind.VALUE
    return Entry(place.file, place.keys, None, encode_leaf(node.value), None)


def _typed(keys: tuple[Key, ...]) -> tuple[tuple[str, Key], ...]:
    """Keys as a dict of either side would tell them apart: ``0``, ``False`` and ``0.0`` are three keys here."""
    return tuple((type(key).__name__, key) for key in keys)


def paired(left: list[Entry], right: list[Entry]) -> list[tuple[Entry | None, Entry | None]]:
    """Pairs in A's order, then B's places A lacks; unpaired non-empty containers left out."""
    by_path = {_typed(entry.keys): entry for entry in right}
    pairs: list[tuple[Entry | None, Entry | None]] = []
    taken: set[int] = set()
    for entry in left:
        other = by_path.get(_typed(entry.keys))
        if other is not None and (other.tensor is None) == (entry.tensor is None):
            taken.add(id(other))
        else:
            other = None
        pairs.append((entry, other))
    lonely_a = _unique_dotted(entry for entry, other in pairs if other is None)
    lonely_b = _unique_dotted(entry for entry in right if id(entry) not in taken)
    for position, (entry, other) in enumerate(pairs):
        if other is None and entry is not None:
            match = lonely_b.get((entry.dotted, entry.tensor is None))
            if match is not None and lonely_a.get((entry.dotted, entry.tensor is None)) is entry:
                pairs[position] = (entry, match)
                taken.add(id(match))
    pairs += [(None, entry) for entry in right if id(entry) not in taken]
    return [(a, b) for a, b in pairs if not _quiet(a, b)]


def _unique_dotted(found: Any) -> dict[tuple[str, bool], Entry]:
    """Entries by dotted key (and whether a value), for keys that name exactly one of them."""
    unique: dict[tuple[str, bool], Entry] = {}
    twice: set[tuple[str, bool]] = set()
    for entry in found:
        name = (entry.dotted, entry.tensor is None)
        if name in unique:
            twice.add(name)
        unique[name] = entry
    return {name: entry for name, entry in unique.items() if name not in twice}


def _quiet(a: Entry | None, b: Entry | None) -> bool:
    """A container with children, alone or beside one of the same kind: told by its contents, not reported."""
    full = [entry for entry in (a, b) if entry is not None and entry.tensor is None and not entry.empty]
    return bool(full) and (a is None or b is None or (len(full) == 2 and a.value == b.value))
