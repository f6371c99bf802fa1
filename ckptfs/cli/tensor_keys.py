"""Naming one tensor on the command line: its file in the mount as ``ckptfs ls`` or ``ckptfs ls --nest`` prints it
(an alias's too), or its dotted state-dict key (``model.embed.weight``); unknown names get the nearest ones in
their error."""

from __future__ import annotations

from ckptfs.checkpoint import Checkpoint
from ckptfs.cli.tree_places import Place, dotted_key, tree_places
from ckptfs.counts import counted
from ckptfs.errors import CkptfsError
from ckptfs.fs.layout import Layout
from ckptfs.fs.nodes import Kind, Node
from ckptfs.fs.resolve import resolve

NEAR_MATCHES = 5
MAX_COMPARED = 200_000
"""Names compared for near matches (difflib costs grow with their number); the rest are not suggested."""


def find_tensor(ck: Checkpoint, name: str) -> tuple[Layout, Node]:
    """The tensor file ``name`` names, links followed, and the layout it is in: a file path of the mount, then a
    dotted key, then a file path of a ``--nest`` mount."""
    layout = Layout(ck)
    node = _file(layout, name)
    if node is not None:
        return layout, node
    every = list(tree_places(layout))
    matching = {id(place.node.value): place for place in every if dotted_key(place.keys) == name}
    if len(matching) == 1:
        return layout, layout.node_of(next(iter(matching.values())).node.value)
    if matching:
        files = ", ".join(place.file for place in matching.values())
        raise CkptfsError(f"key {name!r} names {counted(len(matching), 'tensor')}; give one's file: {files}", ck.path)
    nested = Layout(ck, nest=True)
    node = _file(nested, name)
    if node is not None:
        return nested, node
    raise CkptfsError(f"no tensor {name!r}{near_matches(name, every)}", ck.path)


def _file(layout: Layout, name: str) -> Node | None:
    """The tensor at the file path ``name`` (links followed), None if there is nothing there."""
    try:
        node = resolve(layout, name.strip("/"), follow=True)
    except OSError:
        return None
    if node.kind is not Kind.TENSOR:
        raise CkptfsError(f"{name!r} is a {node.kind.value}, not a tensor", layout.checkpoint.path)
    return node


def near_matches(name: str, every: list[Place]) -> str:
    """``; nearest: a, b`` (files for a name with a ``/``, else keys), or nothing when none is near."""
    import difflib  # here: only a name not found needs it

    candidates = sorted({place.file if "/" in name else dotted_key(place.keys) for place in every[:MAX_COMPARED]})
    near = difflib.get_close_matches(name, candidates, n=NEAR_MATCHES, cutoff=0.6)
    return f"; nearest: {', '.join(near)}" if near else ""
