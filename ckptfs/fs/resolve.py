"""Paths to nodes through links, as the kernel resolves them in a mount: for what reads a ``Layout`` without one
(the fsspec file system, ``ckptfs cat``)."""

from __future__ import annotations

import errno
import os
import posixpath

from ckptfs.fs.layout import Layout
from ckptfs.fs.nodes import Dir, Kind, Node

LINK_KINDS = (Kind.LINK, Kind.VIEW_LINK)
MAX_LINKS = 40
"""Links followed resolving one path (as the kernel's ELOOP): a link's target is never a link, so 2 would do."""


def resolve(layout: Layout, path: str, follow: bool) -> Node:
    """The node at ``path`` (relative to the root, ``""`` for it), through links to directories on the way and,
    when ``follow``, a link at its end. FileNotFoundError, NotADirectoryError as ``open`` would raise them."""
    node = layout.lookup("/" + path)
    if node is not None and (not follow or node.kind not in LINK_KINDS):
        return node
    node, links = layout.root, 0
    parts = path.split("/") if path else []
    for position, name in enumerate(parts):
        if not isinstance(node, Dir):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
        child = layout.entry(node, name)
        if child is None:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
        while child.kind in LINK_KINDS and (follow or position < len(parts) - 1):
            links += 1
            if links > MAX_LINKS:
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
            child = resolve(layout, link_path(layout, child), follow=False)
        node = child
    return node


def link_path(layout: Layout, node: Node) -> str:
    """Where a link points, as a path from the root (``""`` for the root)."""
    parent = layout.path_of(node.parent) if node.parent is not None else "."
    target = posixpath.normpath(posixpath.join(parent, layout.link_target(node)))
    return "" if target == "." else target
