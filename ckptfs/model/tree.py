"""The object tree: which values are containers, their children, and tensor paths.

``children`` is the one definition of the tree's shape; paths, the CLI's JSON
and the filesystem layout all follow it. The walk is iterative (no recursion
limit) and visits every object once, so shared references and cycles cost
nothing extra.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

from ckptfs.errors import LimitExceededError
from ckptfs.limits import Limits
from ckptfs.model.records import Key, NestedTensor, SparseTensor, Tensor, Trail, path_of
from ckptfs.pickle.values import Global, PickledObject

CALLABLE_KEY = "__callable__"
ARGS_KEY = "__args__"
KWARGS_KEY = "__kwargs__"
STATE_KEY = "__state__"


CONTAINER_TYPES = (dict, list, tuple, PickledObject, SparseTensor, NestedTensor)


def is_container(value: Any) -> bool:
    return isinstance(value, CONTAINER_TYPES)


def children(value: Any) -> list[tuple[Key, Any]]:
    """The (key, child) pairs of a container, in pickle order; [] for a leaf."""
    if isinstance(value, dict):
        return list(value.items())
    if isinstance(value, (list, tuple)):
        return list(enumerate(value))
    if isinstance(value, (SparseTensor, NestedTensor)):
        return list(value.components.items())
    if isinstance(value, PickledObject):
        return _object_children(value)
    return []


def _object_children(obj: PickledObject) -> list[tuple[Key, Any]]:
    """Everything the pickle gave the object: what was called unless a name, arguments, items and states.

    A state that is a dict of str keys (``__dict__``, or the pair of a
    ``__slots__`` state whose two dicts share no key) shows its attributes as
    the object's own children, as TorchScript modules' do, unless items were
    set on the object too; any other state is one child, ``__state__``, and so
    is the state of each further ``BUILD``.
    """
    items: list[tuple[Key, Any]] = []
    if not isinstance(obj.callable, Global):  # the result of another call (``getattr(module, 'system')``…)
        items.append((CALLABLE_KEY, obj.callable))
    if obj.args:
        items.append((ARGS_KEY, obj.args))
    if obj.kwargs is not None:
        items.append((KWARGS_KEY, obj.kwargs))
    items += obj.dict_items
    items += enumerate(obj.list_items)
    attributes = None if obj.dict_items or obj.list_items else _attributes(obj.state)
    if attributes is not None:
        items += attributes
    elif obj.state is not None:
        items.append((STATE_KEY, obj.state))
    items += ((STATE_KEY, later) for later in obj.later_states or ())
    return items


def _attributes(state: Any) -> list[tuple[Key, Any]] | None:
    """The attributes a state sets when it sets nothing else: a dict of str keys, or a ``__slots__`` pair of them."""
    if isinstance(state, dict):
        dicts = [state]
    elif isinstance(state, tuple) and len(state) == 2 and all(s is None or isinstance(s, dict) for s in state):
        dicts = [s for s in state if s]
        if len(dicts) == 2 and dicts[0].keys() & dicts[1].keys():
            return None
    else:
        return None
    if not all(type(key) is str for d in dicts for key in d):
        return None
    return [pair for d in dicts for pair in d.items()]


def child_at(value: Any, key: Key) -> Any:
    """The child of a container under ``key``, as ``children`` gives it; KeyError if there is none."""
    if isinstance(value, dict):
        try:
            return value[key]
        except TypeError:
            raise KeyError(key) from None
    if isinstance(value, (list, tuple)) and type(key) is int and 0 <= key < len(value):
        return value[key]
    for k, child in children(value):
        if k == key:
            return child
    raise KeyError(key)


@dataclass
class Visit:
    value: Any
    first: bool
    """False when this object was already visited at another path (a shared reference)."""
    trail: Trail

    @property
    def path(self) -> tuple[Key, ...]:
        return path_of(self.trail)


def walk(root: Any, limits: Limits = Limits()) -> Iterator[Visit]:
    """Depth-first pre-order walk; a shared object is yielded once per path, expanded once."""
    seen: set[int] = set()
    stack: list[tuple[Trail, int, Any]] = [(None, 0, root)]
    nodes = 0
    while stack:
        trail, depth, value = stack.pop()
        nodes += 1
        if nodes > limits.max_tree_nodes:
            raise LimitExceededError(f"object tree has more than {limits.max_tree_nodes} nodes (limit max_tree_nodes)")
        shareable = is_container(value) or isinstance(value, Tensor)
        first = not shareable or id(value) not in seen
        yield Visit(value, first, trail)
        if not first:
            continue
        if shareable:
            seen.add(id(value))
        if not is_container(value):
            continue
        if depth >= limits.max_tree_depth:
            raise LimitExceededError(f"object tree nests deeper than {limits.max_tree_depth} (limit max_tree_depth)")
        for key, child in reversed(children(value)):
            stack.append(((key, trail), depth + 1, child))
