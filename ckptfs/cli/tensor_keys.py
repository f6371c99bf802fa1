"""Naming one tensor on the command line: its file in the mount (as ``ckptfs ls`` prints it) or its dotted
state-dict key (``model.embed.weight``); unknown names get the nearest ones in their error."""

from __future__ import annotations

import difflib
from typing import NamedTuple

from ckptfs.errors import CkptfsError
from ckptfs.fs.layout import Layout
from ckptfs.fs.nodes import Dir, Kind, Node
from ckptfs.fs.resolve import LINK_KINDS, resolve
from ckptfs.model.records import Tensor

NEAR_MATCHES = 5
MAX_COMPARED = 200_000
"""Names compared for near matches (difflib costs grow with their number); the rest are not suggested."""


class Place(NamedTuple):
    """One place a tensor is reachable at: its file there (a link for a tensor met again) and its dotted key."""

    file: str
    dotted: str
    tensor: Tensor


def dotted_key(keys: list[object]) -> str:
    """A key path as a state dict spells it: ``model.layers.0.weight``."""
    return ".".join(str(key) for key in keys)


def places(layout: Layout) -> list[Place]:
    """Every place of every tensor (each directory once: a shared one at its first place), in mount order."""
    found: list[Place] = []
    stack: list[tuple[Dir, str, list[object]]] = [(layout.root, "", [])]
    while stack:
        directory, folder, keys = stack.pop()
        later: list[tuple[Dir, str, list[object]]] = []
        for node in layout.children(directory):
            path, node_keys = folder + node.name, keys + [node.key]
            if isinstance(node, Dir):
                later.append((node, path + "/", node_keys))
            elif isinstance(node.value, Tensor) and node.kind in (Kind.TENSOR, *LINK_KINDS):
                found.append(Place(path, dotted_key(node_keys), node.value))
        stack.extend(reversed(later))
    return found


def find_tensor(layout: Layout, name: str) -> Node:
    """The tensor file ``name`` names (a file path first, then a dotted key), links followed."""
    path = name.strip("/")
    try:
        node = resolve(layout, path, follow=True)
    except OSError:
        node = None
    if node is not None and node.kind is Kind.TENSOR:
        return node
    if node is not None:
        raise CkptfsError(f"{name!r} is a {node.kind.value}, not a tensor", layout.checkpoint.path)
    every = places(layout)
    matching = {id(place.tensor): place for place in every if place.dotted == name}
    if len(matching) == 1:
        return layout.node_of(next(iter(matching.values())).tensor)
    if matching:
        files = ", ".join(place.file for place in matching.values())
        raise CkptfsError(f"key {name!r} names {len(matching)} tensors; give one's file: {files}",
                          layout.checkpoint.path)
    raise CkptfsError(f"no tensor {name!r}{near_matches(name, every)}", layout.checkpoint.path)


def near_matches(name: str, every: list[Place]) -> str:
    """``; nearest: a, b`` (files for a name with a ``/``, else keys), or nothing when none is near."""
    spelled = (lambda place: place.file) if "/" in name else (lambda place: place.dotted)
    candidates = sorted({spelled(place) for place in every[:MAX_COMPARED]})
    near = difflib.get_close_matches(name, candidates, n=NEAR_MATCHES, cutoff=0.6)
    return f"; nearest: {', '.join(near)}" if near else ""
