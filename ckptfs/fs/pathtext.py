"""Tensors' key paths made fast however deep they are: their JSON text, its length, their keys for display.

Texts are made with ``trails.TrailCache`` (the encoded keys of each parent
trail), so the path of a tensor 990 keys deep costs one key's encoding and
one join rather than 990 encodings.

``PathTexts`` gives the text sidecars and the index spell out (equal to
``dumps([encode_key(k) for k in path])``); ``key_size`` about a key's length:
opening a checkpoint sums them along every path (``max_key_bytes``).
"""

from __future__ import annotations

from operator import itemgetter

from ckptfs.errors import LimitExceededError
from ckptfs.model.encoding import key_text
from ckptfs.model.jsontext import plain_lengths
from ckptfs.model.records import Trail
from ckptfs.model.trails import key_lists

SEPARATOR = ", "


class PathTexts:
    """``path_text(trail)``: the JSON text of a key path, at most ``max_bytes`` long (else LimitExceededError)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._parts = key_lists(key_text)
        self._last: tuple[Trail, str] = (None, "[")
        """The last parent trail asked for and its text up to the child's key: siblings come in a row."""

    def path_text(self, trail: Trail) -> str:
        if trail is None:
            return "[]"
        key, parent = (trail, None) if type(trail) is str else trail
        last_parent, prefix = self._last
        if parent is not last_parent:
            parts = self._parts.value(parent)
            prefix = "[" + SEPARATOR.join(parts) + SEPARATOR if parts else "["
            if len(prefix) > self.max_bytes:
                raise _too_long(self.max_bytes)
            self._last = (parent, prefix)
        own = key_text(key)
        if len(prefix) + len(own) + 1 > self.max_bytes:
            raise _too_long(self.max_bytes)
        return prefix + own + "]"

    def lengths(self, trails: list[Trail]) -> list[int]:
        """``[len(self.path_text(t)) for t in trails]``; in one pass when they are siblings keyed by str keys that
        need no escapes (a state dict's tensors), else one by one."""
        kinds = set(map(type, trails))
        if kinds == {str}:  # short trails: str keys at the root
            keys = trails
        elif kinds == {tuple} and len(set(map(id, map(_PARENT, trails)))) == 1:
            keys = list(map(_KEY, trails))
        else:
            keys = []
        if keys:
            own = plain_lengths(keys) if set(map(type, keys)) == {str} else None
            if own is not None:
                longest = max(own)
                base = len(self.path_text(trails[own.index(longest)])) - longest  # raises if that one is too long
                return [base + length for length in own]
        return [len(self.path_text(trail)) for trail in trails]


_KEY, _PARENT = itemgetter(0), itemgetter(1)


def _too_long(max_bytes: int) -> LimitExceededError:
    return LimitExceededError(f"a key path's JSON text exceeds {max_bytes} bytes (limit max_generated_bytes)")
