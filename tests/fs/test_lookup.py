"""Looking up one path (``fs.lookup``) finds exactly what the full listing shows, without making the directory.

Every entry of a fully listed tree is looked up again in a fresh ``Layout``: the same kind, name, inode number,
key, object, size, link target and bytes, and (outside ``/.ckptfs`` and ``/.zarr``) the root's entries never made.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
from corpus import CORPUS_NAMES, CorpusFile, save_zip
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import ckptfs
from ckptfs.fs.layout import Layout
from ckptfs.fs.nest import Group
from ckptfs.fs.names import child_names
from ckptfs.fs.nodes import Dir, Kind, Node
from ckptfs.fs.pieces import Content, read_content
from ckptfs.fs.zarr import ZARR_DIR
from ckptfs.fsspec import CheckpointFileSystem
from ckptfs.model.encoding import encode_key

LINKS = (Kind.LINK, Kind.VIEW_LINK)


def _listed(layout: Layout) -> Iterator[tuple[str, Node]]:
    """Every entry the listings show (and ``/.zarr`` with its top level), by its path, directories first."""
    stack: list[tuple[str, Dir]] = [("", layout.root)]
    zarr = layout.lookup("/" + ZARR_DIR)
    if isinstance(zarr, Dir):
        yield "/" + ZARR_DIR, zarr
        yield from (("/" + ZARR_DIR + "/" + node.name, node) for node in layout.listing(zarr))
    while stack:
        base, directory = stack.pop()
        for node in layout.listing(directory):
            path = f"{base}/{node.name}"
            yield path, node
            if isinstance(node, Dir) and node.kind is Kind.DIR:
                stack.append((path, node))


def _facts(layout: Layout, node: Node) -> tuple[Any, ...]:
    """What an entry shows: its identity in the tree, size, link target and bytes."""
    size = layout.size(node)
    if isinstance(node, Dir) or node.kind in LINKS:
        data = layout.link_target(node) if node.kind in LINKS else None
    else:
        data = read_content(layout.checkpoint, Content(layout.pieces(node), size), 0, size)
    key = None if node.key is None else json.dumps(encode_key(node.key))
    value = node.value.prefix if isinstance(node.value, Group) else id(node.value)  # a --nest group: each Layout's own
    return node.kind, node.name, node.ino, key, value, size, data


def _same_as_listed(checkpoint: ckptfs.Checkpoint, **options: Any) -> int:
    """Checks every listed entry against its lookup in a fresh layout; the number of entries."""
    full = Layout(checkpoint, **options)
    listed = [(path, _facts(full, node)) for path, node in _listed(full)]
    for path, facts in listed:
        fresh = Layout(checkpoint, **options)
        node = fresh.lookup(path)
        assert node is not None, path
        assert _facts(fresh, node) == facts, path
        if not path.startswith(("/.ckptfs", "/" + ZARR_DIR)):
            assert fresh.root.entries is None, f"{path}: looking it up made the root's entries"
    directories = [""] + [path for path, facts in listed if facts[0] is Kind.DIR]
    for path in directories:  # names a listing may or may not show: found as the built directory finds them
        fresh = Layout(checkpoint, **options)
        for name in ("%#0", "00", "01", "\u0663", "-1", "+1", "7", "99999", "7.json", "0.npy", ".x", "%3D", "x%#1"):
            built, found = full.lookup(f"{path}/{name}"), fresh.lookup(f"{path}/{name}")
            assert (found is None) == (built is None), f"{path}/{name}"
            assert found is None or _facts(fresh, found) == _facts(full, built), f"{path}/{name}"  # type: ignore
    return len(listed)


@pytest.mark.parametrize("name", CORPUS_NAMES)
def test_every_corpus_entry_looks_up_as_listed(corpus: dict[str, CorpusFile], name: str) -> None:
    with ckptfs.open(corpus[name].path) as ck:
        assert _same_as_listed(ck) > len(ck.tensors)
        if name in ("r1_views_containers", "whole_module", "r5_scripted"):
            _same_as_listed(ck, nest=True)
            _same_as_listed(ck, views=["json"])


class _Repeating:
    """Pickled with its items set one by one (``SETITEMS``): a hand-made pickle can repeat a key."""

    def __init__(self, items: list[tuple[Any, Any]]) -> None:
        self.items = items

    def __reduce__(self) -> tuple[Any, ...]:
        return _Repeating, ([],), None, None, iter(self.items)


def test_hostile_names_and_collisions_look_up_as_listed(tmp_path: Path) -> None:
    shared = torch.arange(4.0)
    long_a, long_b = "k" * 300 + "a", "k" * 300 + "b"  # one 200-byte prefix: told apart by their hashes
    tree = {
        7: shared, "7": torch.ones(1), "007": 1, "-0": 2, ".": 3, "..": 4, ".hidden": torch.zeros(2),
        "a/b": 5, "w.json": 6, "w": shared, "model.safetensors": torch.ones(3), ".ckptfs": 7, ".zarr": 8,
        "%41": 9, "nul\0and\nnewline": torch.ones(2), "\udcff": 10, "": 11, True: 12, None: 13, 2.5: 14,
        (1, "x"): torch.ones(1), long_a: torch.ones(1), long_b: shared,
        "x.y.z": torch.ones(2), "x.y.w": {"a.b.c": shared, "q": [shared, {"r": torch.ones(1)}]},
        "dup": _Repeating([("a", torch.ones(1)), ("a", shared), ("7", 1), (7, torch.ones(2)), ("7", 3)]),
    }
    with ckptfs.open(save_zip(tree, tmp_path / "hostile.pt")) as ck:
        names = [node.name for node in Layout(ck).children(Layout(ck).root)]
        assert "%37" in names and "%2Ehidden" in names and "w%2Ejson" in names  # escapes and collisions shown
        dup = Layout(ck).lookup("/dup")
        assert isinstance(dup, Dir)
        assert child_names([key for key, _ in Layout(ck).places.pairs(dup.value)]) == [
            "__args__", "a", "a%#2", "%37", "7", "%37%#5"]
        assert _same_as_listed(ck) > 3 * len(tree)
        assert _same_as_listed(ck, nest=True) > 3 * len(tree)


def test_a_lookup_makes_the_nodes_on_its_way_only(tmp_path: Path) -> None:
    """A 2,000-tensor state dict: ``cat_file``, ``info`` of a sidecar and ``open`` of a ``.npy`` make one node for
    the tensor (and one per view), none for its 1,999 siblings; a later listing reuses those nodes."""
    state = {f"layers.{i}.weight": torch.full((2,), float(i)) for i in range(2000)}
    fs = CheckpointFileSystem(fo=str(save_zip(state, tmp_path / "many.pt")))
    try:
        layout = fs.layout
        assert fs.cat_file("layers.1234.weight") == state["layers.1234.weight"].numpy().tobytes()
        assert fs.info("layers.7.weight.json")["size"] > 0
        with fs.open("layers.9.weight.npy") as npy:
            assert npy.read()[:6] == b"\x93NUMPY"
        with pytest.raises(FileNotFoundError):
            fs.info("layers.2000.weight")
        root = layout.root
        assert root.entries is None and root.named is None  # no name made for the other children
        assert root.made is not None and sorted(root.made) == [7, 9, 1234]
        kept = dict(root.made)
        listed = layout.children(root)
        assert all(listed[position] is node for position, node in kept.items())
        assert root.made is None and len(listed) == 2000
    finally:
        fs.close()


def _tensor_or_value(n: int) -> Any:
    return torch.full((1,), float(n)) if n % 3 else n


_keys = st.one_of(
    st.integers(-5, 5), st.integers(-5, 5).map(str), st.text(max_size=6), st.booleans(), st.none(),
    st.text(alphabet="./%-07jsonpy", max_size=8), st.sampled_from(["a.b.c", "a.b.d", "a.b", "a", "x.y.z.w", "a..b"]),
    st.text(alphabet="k", min_size=250, max_size=252),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keys=st.lists(_keys, min_size=1, max_size=12), shared=st.lists(st.booleans(), min_size=12, max_size=12),
       nest=st.booleans())
@example(keys=["7", 7, "a.b.c", "a.b", "a", ".x", "y.npy"], shared=[True, False] * 6, nest=True)
def test_random_key_sets_look_up_as_listed(tmp_path: Path, keys: list[Any], shared: list[bool], nest: bool) -> None:
    one = torch.arange(3.0)
    tree: dict[Any, Any] = {}
    for n, key in enumerate(keys):
        tree[key] = one if shared[n] else _tensor_or_value(n)
    tree["sub"] = {key: one if shared[-1 - n] else _tensor_or_value(n) for n, key in enumerate(keys)}
    tree["list"] = [one if shared[n] else _tensor_or_value(n) for n in range(len(keys))]
    with ckptfs.open(save_zip(tree, tmp_path / "keys.pt")) as ck:
        _same_as_listed(ck, nest=nest)
