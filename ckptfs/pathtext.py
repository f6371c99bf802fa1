"""The JSON text of tensors' key paths (sidecars' and the index's ``path``), without re-encoding shared prefixes.

A tensor's path is its trail (``model.Trail``); siblings share their parent's
trail, and the encoded keys of a parent trail are kept in a bounded cache, so
the text of a tensor 990 keys deep costs one key's encoding and one join
rather than 990 encodings. The text equals ``dumps([encode_key(k) for k in path])``.

``PathLengths`` gives just their lengths, and ``key_size`` a key's: opening a
checkpoint sums them (``max_key_bytes``), since ``ls``, ``info --json``,
sidecars and the index all spell them out.
"""

from __future__ import annotations

from typing import Any

from ckptfs.describe import encode_key
from ckptfs.errors import LimitExceededError
from ckptfs.jsontext import scalar_text
from ckptfs.model import Trail

CACHED_TRAILS = 4096
"""Parent trails whose encoded keys are kept (each holds one reference per key: bounded memory)."""
SEPARATOR = ", "


class PathTexts:
    """``path_text(trail)``: the JSON text of a key path, at most ``max_bytes`` long (else LimitExceededError)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._cache: dict[int, tuple[Trail, list[str], int]] = {}
        self._last: tuple[Trail, str] = (None, "[")
        """The last parent trail asked for and its text up to the child's key: siblings come in a row."""

    def path_text(self, trail: Trail) -> str:
        if trail is None:
            return "[]"
        key, parent = trail
        last_parent, prefix = self._last
        if parent is not last_parent:
            parts, _ = self._parts(parent)
            prefix = "[" + SEPARATOR.join(parts) + SEPARATOR if parts else "["
            self._last = (parent, prefix)
        own = scalar_text(encode_key(key))
        if len(prefix) + len(own) + 1 > self.max_bytes:
            raise _too_long(self.max_bytes)
        return prefix + own + "]"

    def _parts(self, trail: Trail) -> tuple[list[str], int]:
        """The encoded keys of ``trail`` and their joined length (without brackets)."""
        chain: list[Trail] = []
        found: tuple[list[str], int] = ([], 0)
        while trail is not None:
            cached = self._cache.get(id(trail))
            if cached is not None and cached[0] is trail:
                found = cached[1], cached[2]
                break
            chain.append(trail)
            trail = trail[1]
        parts, length = found
        if len(self._cache) + len(chain) > CACHED_TRAILS:
            self._cache.clear()
        for link in reversed(chain):
            own = scalar_text(encode_key(link[0]))
            length += len(own) + (len(SEPARATOR) if parts else 0)
            if length > self.max_bytes:
                raise _too_long(self.max_bytes)
            parts = [*parts, own]
            self._cache[id(link)] = (link, parts, length)
        return parts, length


class PathLengths:
    """``length(trail)``: ``len(path_text(trail))``, from per-parent lengths kept in a bounded cache.

    A path longer than ``max_bytes`` fails as soon as its keys add up past it.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._cache: dict[int, tuple[Trail, int]] = {}

    def length(self, trail: Trail) -> int:
        if trail is None:
            return 2
        return self._joined(trail) + 2

    def _joined(self, trail: Trail) -> int:
        """The length of the keys' texts joined by separators, without brackets."""
        chain: list[Trail] = []
        length = 0
        while trail is not None:
            cached = self._cache.get(id(trail))
            if cached is not None and cached[0] is trail:
                length = cached[1]
                break
            chain.append(trail)
            trail = trail[1]
        if len(self._cache) + len(chain) > CACHED_TRAILS:
            self._cache.clear()
        for link in reversed(chain):
            length += len(scalar_text(encode_key(link[0]))) + (len(SEPARATOR) if link[1] is not None else 0)
            if length > self.max_bytes:
                raise LimitExceededError(f"a tensor's key path exceeds {self.max_bytes} bytes "
                                         "(limit max_key_bytes)")
            self._cache[id(link)] = (link, length)
        return length


def key_size(key: Any) -> int:
    """About the length of a key's JSON text: exact for str keys without escapes, and for ints."""
    kind = type(key)
    if kind is str:
        return len(key) + 2
    if kind is int:
        return len(int.__repr__(key))
    return len(scalar_text(encode_key(key)))


def _too_long(max_bytes: int) -> LimitExceededError:
    return LimitExceededError(f"a key path's JSON text exceeds {max_bytes} bytes (limit max_generated_bytes)")
