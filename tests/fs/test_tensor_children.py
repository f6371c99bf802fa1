"""A directory of tensors only, its nodes made when asked for (``fs.nodes.TensorChildren``), shows what nodes made
one by one show: the same listing, entries, lookups, inode numbers and link targets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from corpus import save_zip

import ckptfs
import ckptfs.fs.layout
import ckptfs.fs.nodes
from ckptfs.fs.layout import Layout
from ckptfs.fs.nodes import Dir, Node, TensorChildren
from ckptfs.model.records import Tensor


def described(node: Node | None, layout: Layout) -> tuple[Any, ...] | None:
    if node is None:
        return None
    target = layout.link_target(node) if node.kind.name.endswith("LINK") else None
    value = node.value.path if isinstance(node.value, Tensor) else type(node.value).__name__
    return node.ino, node.kind, node.name, layout.path_of(node), node.key, value, target


def everything(ck: ckptfs.Checkpoint) -> tuple[list[Any], bool]:
    """Every directory's listing (nodes and columns), each entry looked up by its path and its inode number, and
    names no entry has; whether a directory's children were made when asked for."""
    layout = Layout(ck)
    seen: list[Any] = []
    lazy = False
    stack = ["/"]
    while stack:
        path = stack.pop()
        directory = layout.lookup(path)
        assert isinstance(directory, Dir)
        listing = layout.listing(directory)
        lazy = lazy or isinstance(layout.children(directory), TensorChildren)
        seen.append([described(node, layout) for node in listing])
        seen.append(layout.listing_columns(directory, 1, len(listing) - 1))
        seen.append([layout.listing_columns(directory, start, start + 4) for start in range(len(listing))])
        seen.append(layout.listing_sizes(directory, 1, len(listing)))
        seen.append([layout.size(node) for node in listing[1:]])
        seen.append([described(node, layout) for node in layout.children(directory)])
        seen.append([described(layout.children(directory)[-1], layout)] if layout.children(directory) else [])
        prefix = path.rstrip("/") + "/"
        for node in listing:
            seen.append(described(layout.lookup(prefix + node.name), layout))
            seen.append(described(layout.node_at(node.ino), layout))
        seen.append([described(layout.lookup(prefix + name), layout) for name in ("nothing", "nothing.json", "7")])
        stack.extend(prefix + node.name for node in listing if node.kind.name == "DIR" and node.name != ".ckptfs")
    return seen, lazy


@pytest.mark.parametrize("index_first", [False, True])
def test_made_when_asked_for_as_made_one_by_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                index_first: bool) -> None:
    tied = torch.arange(3.0)
    flat: dict[str, Any] = {f"w{i}": torch.full((i % 3 + 1,), float(i)) for i in range(12)}
    flat.update({"tied": tied, "a/b": torch.zeros(2), "": torch.ones(1), ".x": torch.ones(2), "7": tied,
                 "x.json": torch.zeros(1)})
    inner = {f"t{i}": torch.full((2,), float(i)) for i in range(5)} | {"again": tied, "back": flat["w3"]}
    path = save_zip({**flat, "inner": inner, "later": tied}, tmp_path / "tensors.pt")
    results = []
    for bulk in (1 << 30, 0):
        monkeypatch.setattr(ckptfs.fs.layout, "BULK_SIZES", bulk)
        monkeypatch.setattr(ckptfs.fs.nodes, "BULK_SIZES", bulk)
        monkeypatch.setattr(ckptfs.fs.layout, "TENSOR_CHILDREN_FROM", max(bulk, 1))
        with ckptfs.open(path) as ck:
            if index_first:
                Layout(ck).index_bytes()
            results.append(everything(ck))
    (by_one, lazy_one), (by_bulk, lazy_bulk) = results
    assert not lazy_one and lazy_bulk
    assert len(by_one) == len(by_bulk) and by_one == by_bulk
