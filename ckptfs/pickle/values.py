"""The values a restricted pickle interpreter makes: inert names and objects, keys kept by identity."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Global:
    """A ``module.name`` reference from the stream; never imported."""

    module: str
    name: str

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.name}"


@dataclass(eq=False, repr=False, slots=True)
class PickledObject:
    """An inert description of an object the pickle would have constructed."""

    callable: Any
    args: tuple[Any, ...] = ()
    kwargs: Any = None
    """``NEWOBJ_EX``'s keyword arguments (a dict, unless the pickle is hand-made); None when there are none."""
    state: Any = None
    later_states: list[Any] | None = None
    """States of further ``BUILD``s (a hand-made pickle's: the first may plant a ``__setstate__``)."""
    list_items: list[Any] | tuple[()] = ()
    """Items of ``APPEND``s and ``ADDITEMS`` (a list from the first one on: most objects have none)."""
    dict_items: list[tuple[Any, Any]] | tuple[()] = ()

    def appended_list(self) -> list[Any]:
        """``list_items``, to be added to."""
        if isinstance(self.list_items, list):
            return self.list_items
        made: list[Any] = []
        self.list_items = made
        return made

    def appended_dict(self) -> list[tuple[Any, Any]]:
        """``dict_items``, to be added to."""
        if isinstance(self.dict_items, list):
            return self.dict_items
        made: list[tuple[Any, Any]] = []
        self.dict_items = made
        return made

    @property
    def class_name(self) -> str:
        return self.callable.qualname if isinstance(self.callable, Global) else type(self.callable).__name__

    def __repr__(self) -> str:
        # The arguments only bounded (``short_repr``): they may be deep, cyclic or shared 2**40 times.
        return f"<{self.class_name}(...)>"


class Unbuilt:
    """A memo slot whose object a fast path did not make (``dcp_record``): a get of it stops the parse."""

    def __repr__(self) -> str:
        return "<unbuilt>"


UNBUILT = Unbuilt()


class FastPathRefused(Exception):
    """The DCP fast parse met what its rows do not stand for (a get of ``UNBUILT``, a copy of a row, a ``BUILD``
    on one): the pickle is parsed again on the reference path (not a ``CkptfsError``)."""


class Row:
    """A fast path's stand-in for the inert object of one of torch's DCP items (``dcp_record``), made with no
    arguments. What the reference path's object would show must show the same: its ``class_name`` and its
    ``short_repr``."""

    __slots__ = ()
    class_name = ""

    def __repr__(self) -> str:
        return f"<{self.class_name}(...)>"


@dataclass(eq=False, repr=False)
class UnhashableKey:
    """A dict key kept by identity: Python cannot hash it (a list…), or hashing it is unbounded.

    Tuples do not cache their hash, so a tuple key that is deep or shares its
    parts (2**40 paths in 300 bytes) is wrapped rather than hashed.
    """

    value: Any

    def __repr__(self) -> str:
        return short_repr(self.value)


class Buildable:
    """Base of ckptfs' own values that accept a ``BUILD`` state."""

    def apply_state(self, state: Any) -> None:
        raise NotImplementedError



Handler = Callable[[tuple[Any, ...]], Any]
Resolver = Callable[[Global], Handler | None]


_REPR_DEPTH = 3
_REPR_ITEMS = 4
_BRACKETS: dict[type, tuple[str, str]] = {
    list: ("[", "]"), tuple: ("(", ")"), set: ("{", "}"), frozenset: ("frozenset({", "})"), dict: ("{", "}"),
}


def short_repr(value: Any, limit: int = 80) -> str:
    """A repr of a pickled value for messages: bounded in size and cost for deep, cyclic or shared values."""
    text = _bounded_repr(value, _REPR_DEPTH, limit)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _bounded_repr(value: Any, depth: int, limit: int) -> str:
    if isinstance(value, (str, bytes, bytearray)):
        return repr(value[: limit + 1])
    if value is None or isinstance(value, (bool, int, float, complex)):
        return repr(value)
    if isinstance(value, Global):
        return value.qualname[: limit + 1]
    if isinstance(value, UnhashableKey):
        return _bounded_repr(value.value, depth, limit)
    if isinstance(value, Row):
        return f"<{value.class_name}()>"
    if isinstance(value, PickledObject):
        if not value.args:
            return f"<{value.class_name}()>"
        return f"<{value.class_name}{_bounded_repr(value.args, depth, limit)}>" if depth else repr(value)
    brackets = _BRACKETS.get(type(value))
    if brackets is None:
        return f"<{type(value).__name__}>"
    if depth == 0:
        return "..."
    if isinstance(value, dict):
        parts = [f"{_bounded_repr(k, depth - 1, limit)}: {_bounded_repr(v, depth - 1, limit)}"
                 for k, v in itertools.islice(value.items(), _REPR_ITEMS)]
    else:
        parts = [_bounded_repr(v, depth - 1, limit) for v in itertools.islice(value, _REPR_ITEMS)]
    if len(value) > _REPR_ITEMS:
        parts.append("...")
    trailer = "," if isinstance(value, tuple) and len(value) == 1 else ""
    return brackets[0] + ", ".join(parts) + trailer + brackets[1]


HASH_BUDGET = 1000
"""Most tuple elements, counted along every path, that hashing one key may visit."""


def hashable_key(value: Any) -> Any:
    """``value`` when it can serve as a dict key or set element, else it wrapped in :class:`UnhashableKey`."""
    if isinstance(value, (str, int, float, bytes, Global)) or value is None:
        return value
    if not _hash_is_bounded(value):
        return UnhashableKey(value)
    try:
        hash(value)
    except TypeError:
        return UnhashableKey(value)
    return value


def _hash_is_bounded(value: Any) -> bool:
    pending = [value]
    budget = HASH_BUDGET
    while pending:
        item = pending.pop()
        if isinstance(item, tuple):
            budget -= len(item)
            if budget < 0:
                return False
            pending.extend(item)
    return True
