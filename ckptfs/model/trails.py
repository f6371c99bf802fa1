"""Values made along a key path, kept per trail so that siblings and cousins share their ancestors' work.

A path is a trail (``model.Trail``): nested ``(key, parent_trail)`` pairs, so
siblings share their parent's trail object. Spelling out the paths of 10,000
tensors 990 keys deep key by key costs ten million steps; ``TrailCache``
makes one step per trail, keeping the values of up to ``CACHED_TRAILS`` of them.
"""

from __future__ import annotations

from typing import Any, Callable, Generic, TypeVar

from ckptfs.model.records import Key, Trail

CACHED_TRAILS = 4096
"""Trails whose values are kept (a value holds at most one reference per key: bounded memory)."""

_T = TypeVar("_T")


class TrailCache(Generic[_T]):
    """A value per trail: ``step(value of the parent, key)``, from ``root`` for the empty path."""

    def __init__(self, root: _T, step: Callable[[_T, Key], _T]) -> None:
        self.root = root
        self.step = step
        self._cache: dict[int, tuple[Trail, _T]] = {}

    def value(self, trail: Trail) -> _T:
        """The trail's value; it and its ancestors are kept for later."""
        chain: list[Trail] = []
        value = self.root
        while trail is not None:
            cached = self._cache.get(id(trail))
            if cached is not None and cached[0] is trail:
                value = cached[1]
                break
            chain.append(trail)
            trail = trail[1]
        if len(self._cache) + len(chain) > CACHED_TRAILS:
            self._cache.clear()
        for link in reversed(chain):
            value = self.step(value, link[0])
            self._cache[id(link)] = (link, value)
        return value

    def leaf(self, trail: Trail) -> _T:
        """The trail's value, only its parent's kept (a tensor's trail is its own, its parent its siblings')."""
        if trail is None:
            return self.root
        key, parent = trail
        return self.step(self.value(parent), key)


def key_lists(encode: Callable[[Key], Any]) -> TrailCache[tuple[Any, ...]]:
    """Every key of a trail, from the root, as ``encode`` makes it."""
    return TrailCache((), lambda keys, key: (*keys, encode(key)))
