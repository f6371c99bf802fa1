"""A big directory's listing windows (``CheckpointFS._make_window``) made with numpy (where it is imported already:
``Dir.listed_arrays``) are byte for byte the windows made from the entries' columns: the same names and the same ``struct stat``s (``fuse_entry_param``s for the low-level lister)."""

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
from ckptfs.fs.nodes import Dir, Kind
from ckptfs.fuse import operations as fuse_ops
from ckptfs.fuse.inodes import InodeFS

pytestmark = [pytest.mark.filterwarnings("ignore:torch.quantize_per"),
              pytest.mark.filterwarnings("ignore:TypedStorage")]


def _windows(fs: fuse_ops.CheckpointFS, layout: Layout, bulk: bool, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every window of every directory, from every start (windows of 5 entries), made with or without numpy."""
    monkeypatch.setattr(fuse_ops, "numpy_loaded", lambda: bulk)
    made: list[Any] = []
    for path in ("/", "/inner", "/mixed"):
        directory = layout.lookup(path)
        assert isinstance(directory, Dir)
        sizes = fs._listing(directory).sizes
        for start in range(len(sizes)):
            window = fs._make_window(directory, start, sizes)
            made.append((path, start, window.names.texts, window.names.text, bytes(window.memory)))
    return made


@pytest.mark.parametrize("lister", [fuse_ops.CheckpointFS, InodeFS])
def test_windows_made_with_numpy_are_the_windows_made_from_columns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   lister: type[fuse_ops.CheckpointFS]) -> None:
    tied = torch.arange(3.0)
    per_channel = torch.quantize_per_channel(torch.ones(3, 2), torch.tensor([0.5, 0.25, 0.125]),
                                             torch.tensor([0, 1, 2]), 0, torch.qint8)
    flat: dict[str, Any] = {f"w{i}": torch.full((i % 3 + 1,), float(i)) for i in range(9)}
    flat.update({"tied": tied, "q": per_channel, "bf": torch.ones(2, dtype=torch.bfloat16), "big": torch.ones(700)})
    inner = {f"t{i}": torch.full((2,), float(i)) for i in range(6)} | {"again": tied, "q2": per_channel, "é": tied,
                                                                       "empty": torch.ones(0), "block": torch.ones(128),
                                                                       "huge": torch.zeros(1).expand(1 << 62)}
    obj = {**flat, "inner": inner, "mixed": {"a": torch.ones(1), "n": 3, "b": tied}}
    monkeypatch.setattr(ckptfs.fs.layout, "BULK_SIZES", 0)
    monkeypatch.setattr(ckptfs.fs.nodes, "BULK_SIZES", 0)
    monkeypatch.setattr(fuse_ops, "WINDOW", 5)
    with ckptfs.open(save_zip(obj, tmp_path / "windows.pt")) as ck:
        layout = Layout(ck)
        by_columns = _windows(lister(ck, layout), layout, False, monkeypatch)
        layout = Layout(ck)
        by_arrays = _windows(lister(ck, layout), layout, True, monkeypatch)
        kinds = {kind for directory in ("/", "/inner") for kind in layout.listing_columns(
            layout.lookup(directory), 0, 1 << 20)[2]}  # type: ignore[arg-type]
    assert {Kind.TENSOR, Kind.VIEW, Kind.LINK, Kind.VIEW_LINK} <= kinds
    assert len(by_arrays) == len(by_columns) and by_arrays == by_columns
