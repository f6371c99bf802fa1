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


class Group:
    """A directory made by ``--nest``: keys sharing a dotted prefix. Not an object of the checkpoint."""

    __slots__ = ("prefix", "pairs")

    def __init__(self, prefix: str, pairs: list[tuple[Key, Any]]) -> None:
        self.prefix = prefix
        """The keys' common first parts, joined with dots."""
        self.pairs = pairs
        """``(key, child)``: the rest of each key after the prefix and its value, or a part and a ``Group``."""


_Item = tuple["list[str] | None", Key, Any]
"""A key's parts still to place (None: shown whole), the key as it is then named, its value."""


def nested(pairs: list[tuple[Key, Any]]) -> list[tuple[Key, Any]]:
    """A dict's ``(key, child)`` pairs with the keys sharing first parts grouped (see the module docstring)."""
    items: list[_Item] = []
    for key, child in pairs:
        parts = key.split(".") if isinstance(key, str) and "." in key else None
        if parts is not None and (len(parts) < 3 or len(parts) > MAX_PARTS or not all(parts)):
            parts = None
        items.append((parts, key, child))
    return _level(items, "")


def _level(items: list[_Item], prefix: str) -> list[tuple[Key, Any]]:
    whole = {key for parts, key, _ in items if parts is None or len(parts) < 3}
    order: list[_Item | str] = []
    groups: dict[str, list[_Item]] = {}
    for parts, key, child in items:
        if parts is None or len(parts) < 3 or parts[0] in whole:
            order.append((None, ".".join(parts) if parts else key, child))
            continue
        members = groups.get(parts[0])
        if members is None:
            members = groups[parts[0]] = []
            order.append(parts[0])
        rest = parts[1:]
        members.append((rest, ".".join(rest), child))
    found: list[tuple[Key, Any]] = []
    for entry in order:
        if isinstance(entry, str):
            inner = f"{prefix}.{entry}" if prefix else entry
            found.append((entry, Group(inner, _level(groups[entry], inner))))
        else:
            found.append((entry[1], entry[2]))
    return found
