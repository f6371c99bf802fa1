"""``--nest``: a dict's dotted str keys shown as directories, ``model.layers.0.mlp.w1.weight`` as
``model/layers/0/mlp/w1.weight``.

The rule, per dict (every dict of the tree, its own keys only):

* A str key of three or more non-empty dot-separated parts (``a.b.c``) goes into a directory named by its
  first part (``a/``) as ``b.c``; the same rule is applied again inside, so every part but the last two
  is a directory and the last two are the file's name (a module's path, then ``w1.weight``: the
  parameter with its module, as ``named_parameters`` spells it). Keys sharing first parts share their
  directories, listed where the first of them is, in pickle order.
* Keys of fewer parts, keys with an empty part (``a..b``, ``.a``, ``a.``), keys of more than
  ``MAX_PARTS`` parts and keys that are not str are shown whole, as without ``--nest``.
* A dict whose keys would make more than two directories per key is shown flat (``GROUPS_PER_KEY``): keys
  that share no parts would make one per part.
* A directory name that another key shown whole at the same level already has (a key ``a`` beside
  ``a.b.c``) is not made: those keys are shown whole at that level (``a.b.c`` beside ``a``).

So each entry's exact key is its directories' names and its own joined with dots (before the escapes
of ``fs.names``), every key has one path, and a directory made by the rule holds only keys of its
prefix. The sidecars and ``index.json`` keep each tensor's exact key path; ``index.json`` lists a
directory made by the rule as ``{"kind": "nest", "prefix": ...}`` and the keys below it relative to it.
"""

from __future__ import annotations

from typing import Any

from ckptfs.model.records import Key

MAX_PARTS = 64
"""Keys of more parts are shown whole: nesting stays shallow whatever a key holds."""
GROUPS_PER_KEY = 2
"""A dict whose keys would make more directories than this many per key (and ``SPARE_GROUPS`` more) is shown
flat: a model's keys share most of their parts (a 200,000-key mixture of experts makes ~0.35 per key), while
keys sharing none (``a1.b.c.d…``, ``a2.b.c.d…``) would make a directory per part, up to 62 per key."""
SPARE_GROUPS = 64


class Group:
    """A directory made by ``--nest``: keys sharing a dotted prefix. Not an object of the checkpoint."""

    __slots__ = ("prefix", "pairs")

    def __init__(self, prefix: str, pairs: list[tuple[Key, Any]]) -> None:
        self.prefix = prefix
        """The keys' common first parts, joined with dots."""
        self.pairs = pairs
        """``(key, child)``: the rest of each key after the prefix and its value, or a part and a ``Group``."""


_Item = tuple["list[str] | None", Key, Any]
"""A key's dotted parts (None: shown whole), the key, its value."""


class _TooMany(Exception):
    pass


_MAY_NEST: Any = object()
"""``_level``'s name of a key that may go into a directory (any key, None included, may be shown whole)."""


def nested(pairs: list[tuple[Key, Any]]) -> list[tuple[Key, Any]]:
    """A dict's ``(key, child)`` pairs with the keys sharing first parts grouped (see the module docstring), or
    the pairs as they are when that would make too many directories (``GROUPS_PER_KEY``)."""
    items: list[_Item] = []
    for key, child in pairs:
        parts = key.split(".") if isinstance(key, str) and "." in key else None
        if parts is not None and (len(parts) < 3 or len(parts) > MAX_PARTS or "" in parts):
            parts = None
        items.append((parts, key, child))
    try:
        return _level(items, 0, "", [GROUPS_PER_KEY * len(pairs) + SPARE_GROUPS])
    except _TooMany:
        return pairs


def _level(items: list[_Item], depth: int, prefix: str, budget: list[int]) -> list[tuple[Key, Any]]:
    """One directory's pairs, of keys whose first ``depth`` parts are its path; ``budget``: the directories that
    may still be made. A key's rest is joined only where it is shown whole (a key is split once, not per level)."""
    # Each item's name where it is shown whole whatever the others are, else _MAY_NEST.
    names = [key if parts is None else _MAY_NEST if len(parts) - depth >= 3 else ".".join(parts[depth:])
             for parts, key, _ in items]
    whole = set(names)
    order: list[tuple[Key, Any] | str] = []
    groups: dict[str, list[_Item]] = {}
    for item, name in zip(items, names):
        parts = item[0]
        if name is not _MAY_NEST or parts[depth] in whole:  # type: ignore[index]
            order.append((name if name is not _MAY_NEST else ".".join(parts[depth:]), item[2]))  # type: ignore
            continue
        head = parts[depth]  # type: ignore[index]
        members = groups.get(head)
        if members is None:
            budget[0] -= 1
            if budget[0] < 0:
                raise _TooMany
            members = groups[head] = []
            order.append(head)
        members.append(item)
    found: list[tuple[Key, Any]] = []
    for entry in order:
        if isinstance(entry, str):
            inner = f"{prefix}.{entry}" if prefix else entry
            found.append((entry, Group(inner, _level(groups[entry], depth + 1, inner, budget))))
        else:
            found.append(entry)
    return found
