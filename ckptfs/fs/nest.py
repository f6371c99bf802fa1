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

    __slots__ = ("pairs", "prefix")

    def __init__(self, prefix: str, pairs: list[tuple[Key, Any]]) -> None:
        self.prefix = prefix
        """The keys' common first parts, joined with dots."""
        self.pairs = pairs
        """``(key, child)``: the rest of each key after the prefix and its value, or a part and a ``Group``."""


def _nests(key: Key) -> bool:
    """Whether a key may go into directories: a str of three parts or more, at most ``MAX_PARTS``, none empty."""
    return (isinstance(key, str) and 2 <= key.count(".") < MAX_PARTS and ".." not in key and key[0] != "."
            and key[-1] != ".")


def nested(pairs: list[tuple[Key, Any]]) -> list[tuple[Key, Any]]:
    """A dict's ``(key, child)`` pairs with the keys sharing first parts grouped (see the module docstring), or
    the pairs as they are when that would make too many directories (``GROUPS_PER_KEY``).

    Every part of a key but its last two is a directory, so each key goes straight into the directory named by its
    text up to its second last dot, found by that text; the directories above it are made with it, each listed where
    its first key is. Inside a directory every name shown whole has a dot and no directory's does: only a key shown
    whole at the top can take a directory's name.
    """
    flags = [_nests(key) for key, _ in pairs]
    taken = {key for (key, _), nests in zip(pairs, flags) if not nests}
    found: list[tuple[Key, Any]] = []
    groups: dict[str, Group] = {}
    texts: dict[str, str] = {}
    """One str per distinct name made: a model's 200,000 keys end in a few (``w1.weight``)."""
    budget = GROUPS_PER_KEY * len(pairs) + SPARE_GROUPS
    for (key, child), nests in zip(pairs, flags):
        if not nests or key[: key.index(".")] in taken:
            found.append((key, child))
            continue
        cut = key.rfind(".", 0, key.rfind("."))
        folder = groups.get(key[:cut])
        if folder is None:
            folder = _folders(key, cut, groups, found, texts)
            if len(groups) > budget:
                return pairs
        name = key[cut + 1 :]
        folder.pairs.append((texts.setdefault(name, name), child))
    return found


def _folders(key: str, cut: int, groups: dict[str, Group], top: list[tuple[Key, Any]], texts: dict[str, str]) -> Group:
    """The directory of ``key[:cut]``, made with those above it that are not made yet, each listed last in its own."""
    listing, start = top, 0
    while True:
        end = key.index(".", start)
        prefix = key[:end]
        group = groups.get(prefix)
        if group is None:
            part = key[start:end]
            group = groups[prefix] = Group(prefix, [])
            listing.append((texts.setdefault(part, part), group))
        if end == cut:
            return group
        listing, start = group.pairs, end + 1
