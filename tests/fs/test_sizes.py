"""Sizes made in bulk for a listing (``Layout.listing_sizes``) are each entry's own size, found one at a time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from corpus import CORPUS_NAMES, CorpusFile, save_zip
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ckptfs
import ckptfs.fs.layout
import ckptfs.fs.nodes
import ckptfs.fs.sidecar
from ckptfs.checkpoint import Checkpoint
from ckptfs.fs.layout import Layout
from ckptfs.fs.nodes import Dir, Kind
from ckptfs.fs.views import VIEW_NAMES


@pytest.fixture(params=["bulk", "default", "nodes"], autouse=True)
def bulk_from(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test three times: every directory's plan and sizes (sidecars' too) made in bulk; as by default (small
    directories of tensors only in bulk, ``TensorChildren``, others node by node: the test trees' are all under
    ``BULK_SIZES`` entries); every directory node by node."""
    if request.param == "bulk":
        monkeypatch.setattr(ckptfs.fs.layout, "BULK_SIZES", 0)
        monkeypatch.setattr(ckptfs.fs.nodes, "BULK_SIZES", 0)
        monkeypatch.setattr(ckptfs.fs.sidecar, "_BULK", 0)
    if request.param == "nodes":
        monkeypatch.setattr(ckptfs.fs.layout, "TENSOR_CHILDREN_FROM", 1 << 30)


def one_at_a_time(ck: Checkpoint, path: str, **options: Any) -> list[int]:
    """Each entry's size from a layout of its own, asked entry by entry (a getattr's path); a view's checked
    against the length of what it holds."""
    layout = Layout(ck, **options)
    directory = layout.lookup(path)
    assert isinstance(directory, Dir)
    sizes = [layout.size(node) for node in layout.listing(directory)]
    made = [sum(piece.length for piece in layout.pieces(node)) for node in layout.listing(directory)
            if node.kind is Kind.VIEW]
    assert made == [size for node, size in zip(layout.listing(directory), sizes) if node.kind is Kind.VIEW]
    return sizes


def check_every_directory(ck: Checkpoint, cuts: list[int] = [], **options: Any) -> int:  # noqa: B006
    """Bulk sizes of every directory, in windows cut at ``cuts``, against sizes one at a time; the entries seen."""
    layout = Layout(ck, **options)
    stack, seen = ["/"], 0
    while stack:
        path = stack.pop()
        directory = layout.lookup(path)
        assert isinstance(directory, Dir)
        length = layout.listing_length(directory)
        bounds = sorted({0, length, *(cut % (length + 1) for cut in cuts)})
        windows = zip(bounds, bounds[1:])
        bulk = [size for start, stop in windows for size in layout.listing_sizes(directory, start, stop)]
        assert bulk == one_at_a_time(ck, path, **options)
        assert layout.listing_sizes(directory, 0, length + 7) == bulk  # a window past the end, as FUSE asks
        seen += length
        prefix = path.rstrip("/") + "/"
        stack.extend(prefix + node.name for node in layout.listing(directory) if node.kind is Kind.DIR)
    return seen


@pytest.mark.parametrize("name", CORPUS_NAMES)
def test_corpus_listing_sizes(corpus: dict[str, CorpusFile], name: str) -> None:
    with ckptfs.open(corpus[name].path) as ck:
        assert check_every_directory(ck, [1, 5, 17]) > 0
        check_every_directory(ck, nest=True)
        check_every_directory(ck, views=("json",))


def test_links_views_of_links_and_quantized_views(tmp_path: Path) -> None:
    shared = torch.arange(6, dtype=torch.float32)
    per_channel = torch.quantize_per_channel(torch.ones(3, 2), torch.tensor([0.5, 0.25, 0.125]),
                                             torch.tensor([0, 1, 2]), 0, torch.qint8)
    obj = {"a": shared, "b": {"tied": shared, "q": per_channel, "bf": torch.ones(2, dtype=torch.bfloat16)},
           "meta": torch.empty(4, device="meta"), "value": "text", "n": 3, "q": per_channel}
    with ckptfs.open(save_zip(obj, tmp_path / "links.pt")) as ck:
        layout = Layout(ck)
        kinds = {node.kind for node in layout.listing(layout.lookup("/b"))}  # type: ignore[arg-type]
        assert {Kind.VIEW, Kind.VIEW_LINK, Kind.LINK, Kind.TENSOR} <= kinds
        check_every_directory(ck, [2, 3])


_leaves = st.sampled_from(["f32", "bf16", "i8", "empty", "shared", "leaf", "0d"])
_trees = st.recursive(_leaves, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=4), inner, max_size=4), max_leaves=12)


def _make(shape: Any, shared: torch.Tensor) -> Any:
    made = {"f32": lambda: torch.ones(3), "bf16": lambda: torch.ones(2, 5, dtype=torch.bfloat16),
            "i8": lambda: torch.ones(7, dtype=torch.int8), "empty": lambda: torch.ones(0, 4),
            "shared": lambda: shared, "leaf": lambda: "x" * 3, "0d": lambda: torch.tensor(1.5)}
    if isinstance(shape, str):
        return made[shape]()
    if isinstance(shape, dict):
        return {k: _make(v, shared) for k, v in shape.items()}
    return [_make(v, shared) for v in shape]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.dictionaries(st.text(max_size=4), _trees, min_size=1, max_size=4),
       cuts=st.lists(st.integers(0, 40), max_size=3), views=st.sets(st.sampled_from(VIEW_NAMES)))
def test_random_trees_listing_sizes(tmp_path: Path, shape: dict[str, Any], cuts: list[int], views: set[str]) -> None:
    with ckptfs.open(save_zip(_make(shape, torch.arange(4)), tmp_path / "random.pt")) as ck:
        check_every_directory(ck, cuts, views=views)
