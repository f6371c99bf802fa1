"""One child of a directory by its name, without making the directory's entries.

Looking up one path (a FUSE lookup, an fsspec ``info``/``cat_file``/``open``) must not cost what listing the
directory does: a state dict of 20,000 tensors is one directory, and making its entries is a name, a node and a
plan slot per child. Here a name is resolved to the child's position in its container:

* a name only a str key can have (``names.only_str_key``: not escaped, shortened, nor an int's name) in a dict is
  that key (no other key of the dict can have its name, so ``child_names`` does not rename it): found by the key,
  its position by its first place (``Places``) when the child is shown there, in constant time;
* a list's or tuple's child by its index, in constant time;
* a name beginning with ``.`` or ending in a reserved suffix is no key's (``fs.names``): no child;
* any other name (escapes, collisions, ``%=`` keys, an object's or list's children, ``--nest`` groups, a link's or
  a plain value's position) through the directory's names, made once by ``child_names`` as the listing makes
  them (a name per child, no node).

``Layout`` makes the child's node from its position, as the full build would, and keeps it for that build.
"""

from __future__ import annotations

from ckptfs.fs.names import RESERVED_SUFFIXES, ROOT_VALUE_NAME, child_names, only_str_key
from ckptfs.fs.nodes import Dir
from ckptfs.fs.places import DictPairs, Places, holds
from ckptfs.model.records import Tensor

_MISSING = object()


def child_position(places: Places, directory: Dir, name: str, boxed: bool) -> int | None:
    """The position, among its container's children, of the directory's child called ``name`` in its listing, or
    None; ``boxed``: the directory is the root showing a non-container as ``%root``."""
    if not name or name[0] == "." or name.endswith(RESERVED_SUFFIXES):
        return None  # never a key's name (fs.names): a view's, ckptfs' own, or nothing
    container = directory.value
    if not boxed and type(container) in (list, tuple):
        if not (name.isascii() and name.isdigit()) or (name[0] == "0" and name != "0"):
            return None  # a list's children are named by their indices alone
        return int(name) if int(name) < len(container) else None
    if not boxed and type(container) is dict and not places.nest and only_str_key(name):
        child = container.get(name, _MISSING)
        if child is _MISSING:
            return None
        if isinstance(child, Tensor) or holds(child):
            holder, index = places.first_place(child)
            if holder is container:
                key = places.pairs(container)[index][0]
                if type(key) is str and key == name:
                    return index
    return names_of(places, directory, boxed)[1].get(name)


def listed_names(places: Places, directory: Dir, boxed: bool) -> list[str]:
    """The directory's children's names by position, as listed (``names_of``' when made, else not kept)."""
    if directory.named is not None:
        return directory.named[0]
    if boxed:
        return [ROOT_VALUE_NAME]
    pairs = places.pairs(directory.value)
    if isinstance(pairs, DictPairs):
        return child_names(pairs.keys, distinct=True)
    return child_names([key for key, _ in pairs])


def names_of(places: Places, directory: Dir, boxed: bool) -> tuple[list[str], dict[str, int]]:
    """The directory's children's names by position (as listed) and their positions by name, made once."""
    found = directory.named
    if found is None:
        listed = listed_names(places, directory, boxed)
        found = directory.named = (listed, {name: position for position, name in enumerate(listed)})
    return found
