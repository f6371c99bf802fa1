"""``Layout.node_at``: every entry of the tree found from its inode number alone, nothing else from any number."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from corpus import save_zip

import ckptfs
from ckptfs.fs.layout import SLOTS, Layout
from ckptfs.fs.nodes import Dir, Node
from ckptfs.fs.zarr import ZARR_INO


def _tree() -> dict[str, Any]:
    shared = torch.arange(6.0)
    return {"model": {"layer.0.w": shared, "layer.0.b": torch.zeros(2), "layer.1.w": torch.ones(2, 3, dtype=torch.int8),
                      "tied": shared, "bf": torch.ones(2, dtype=torch.bfloat16)},
            "steps": [1, 2.5, "x", None, [torch.ones(1)]], "epoch": 3, "q": torch.quantize_per_channel(
                torch.randn(2, 3), torch.tensor([0.1, 0.2]), torch.tensor([0, 1]), 0, torch.qint8),
            "empty": {}, "again": shared}


def _entries(layout: Layout) -> dict[int, tuple[str, Any, str]]:
    """Every entry listed below the root (``/.zarr`` apart), by inode number: path, kind, name."""
    found: dict[int, tuple[str, Any, str]] = {}
    stack: list[Node] = [layout.root]
    while stack:
        node = stack.pop()
        found[node.ino] = (layout.path_of(node), node.kind, node.name)
        if isinstance(node, Dir):
            stack.extend(layout.listing(node))
    return found


@pytest.mark.parametrize("options", [{}, {"nest": True}, {"views": ("json",)}])
def test_every_entry_is_found_by_its_number_in_a_fresh_layout(tmp_path: Path, options: dict[str, Any]) -> None:
    path = save_zip(_tree(), tmp_path / "t.pt")
    with ckptfs.open(path) as ck:
        listed = _entries(Layout(ck, **options))
    assert all(ino < ZARR_INO for ino in listed)
    with ckptfs.open(path) as ck:
        layout = Layout(ck, **options)  # nothing looked up or listed: each number alone leads to its node
        for ino, (where, kind, name) in listed.items():
            node = layout.node_at(ino)
            assert node is not None, where
            assert (node.ino, layout.path_of(node), node.kind, node.name) == (ino, where, kind, name)
        for ino in range(0, max(listed) + 4 * SLOTS):
            if ino not in listed:
                assert layout.node_at(ino) is None, ino


def test_a_root_that_is_no_container(tmp_path: Path) -> None:
    with ckptfs.open(save_zip(torch.ones(3), tmp_path / "r.pt")) as ck:
        listed = _entries(Layout(ck))
        layout = Layout(ck)
        assert {ino: layout.path_of(layout.node_at(ino)) for ino in listed} == {  # type: ignore[arg-type]
            ino: where for ino, (where, _, _) in listed.items()}


@pytest.mark.parametrize("kept", [1, 2, 4096])
def test_directories_found_by_number_are_the_listed_ones_whatever_is_remembered(
        tmp_path: Path, kept: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Directories found by number are remembered (``DIR_CACHE_SIZE`` at most, then forgotten all at once): each
    number still leads to the very node the listings made, at every depth of a ``--nest`` tree, in any order."""
    monkeypatch.setattr("ckptfs.fs.layout.DIR_CACHE_SIZE", kept)
    keys = [f"model.layers.{layer}.experts.{expert}.w{w}.weight" for layer in range(3) for expert in range(3)
            for w in range(2)]
    path = save_zip({key: torch.full((2,), float(n)) for n, key in enumerate(keys)}, tmp_path / "n.pt")
    with ckptfs.open(path) as ck:
        layout = Layout(ck, nest=True)
        directories: list[Dir] = []
        stack: list[Node] = [layout.root]
        while stack:
            node = stack.pop()
            if isinstance(node, Dir):
                directories.append(node)
                stack.extend(layout.listing(node))
        # The root, .ckptfs, model, layers, its three, their experts, three in each.
        assert len(directories) == 1 + 1 + 1 + 1 + 3 + 3 + 3 * 3
        for node in [*directories, *reversed(directories), *directories[::2]]:
            assert layout.node_at(node.ino) is node, layout.path_of(node)
        tensor = layout.lookup("/model/layers/2/experts/1/w1.weight")
        assert tensor is not None
        for found in (layout.node_at(tensor.ino), layout.node_of(tensor.value)):
            assert found is not None and (found.ino, found.value, found.parent) == (tensor.ino, tensor.value, tensor.parent)
