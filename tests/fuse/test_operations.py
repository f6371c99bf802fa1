"""FUSE callbacks called directly (no mount): listings answer with the attributes getattr gives, within a bound."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
import torch
from corpus import save_zip

import ckptfs
from ckptfs import Limits
from ckptfs.fs.layout import Layout
from ckptfs.fs.nodes import Dir
from ckptfs.fuse import operations as fuse_ops


def _stat_of(fs: fuse_ops.CheckpointFS, path: str) -> bytes:
    st = fuse_ops._STAT()
    assert fs.getattr(path.encode(), ctypes.pointer(st)) == 0
    return bytes(st)


def _checkpoint(tmp_path: Path) -> Path:
    shared = torch.arange(4.0)
    return save_zip({"a": {f"w{n}": torch.zeros(n) for n in range(5)}, "b": [shared, shared, 3, "x"],
                     "c": {}}, tmp_path / "c.pt")


def test_listings_hold_what_getattr_gives(tmp_path: Path) -> None:
    with ckptfs.open(_checkpoint(tmp_path)) as ck:
        layout = Layout(ck)
        fs = fuse_ops.CheckpointFS(ck, layout)
        for path in ("/", "/a", "/b", "/c", "/.ckptfs"):
            directory = layout.lookup(path)
            assert isinstance(directory, Dir)
            listing = fs._listing(directory)
            names = [".", ".."] + [node.name for node in layout.listing(directory)]
            assert [node.name for node in listing.nodes[2:]] == names[2:]
            parent = path.rpartition("/")[0] or "/"
            for position, name in enumerate(names):
                entry = path if name == "." else parent if name == ".." else f"{path.rstrip('/')}/{name}"
                assert bytes(listing.stats[position]) == _stat_of(fs, entry), entry
            assert fs._listing(directory) is listing


def test_kept_listings_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fuse_ops, "MAX_LISTED_ENTRIES", 10)
    with ckptfs.open(_checkpoint(tmp_path)) as ck:
        layout = Layout(ck)
        fs = fuse_ops.CheckpointFS(ck, layout)
        first = layout.lookup("/a")
        assert isinstance(first, Dir)
        kept = fs._listing(first)  # '.', '..' and ten entries: over the bound on its own, kept until the next
        assert fs._listing(first) is kept
        second = layout.lookup("/b")
        assert isinstance(second, Dir)
        fs._listing(second)
        assert fs._listing(first) is not kept
        assert fs._listed <= 10 + len(kept.nodes)


def test_an_entry_whose_size_fails_lists_empty_and_its_siblings_keep_theirs(tmp_path: Path) -> None:
    """Sizes are computed for a whole listing at once; one sidecar over max_generated_bytes spoils only itself."""
    path = save_zip({"a": torch.zeros(2), "k" * 3000: torch.ones(3), "z": torch.zeros(1)}, tmp_path / "long.pt")
    with ckptfs.open(path, Limits(max_generated_bytes=2000)) as ck:
        layout = Layout(ck)
        fs = fuse_ops.CheckpointFS(ck, layout)
        listing = fs._listing(layout.root)
        sizes = {node.name: listing.stats[position].st_size for position, node in enumerate(listing.nodes)}
        long_name = layout.node_of(ck.tensors[1]).name
        assert sizes[long_name + ".json"] == 0
        assert sizes[long_name] == 12
        for name in ("a.json", "z.json"):
            assert sizes[name] == len(layout.content(layout.lookup("/" + name))) > 0
