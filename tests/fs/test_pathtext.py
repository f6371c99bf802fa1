"""Key paths made per trail (texts, keys): equal to making them key by key, cached per parent, bounded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from shapes import long_paths

import ckptfs
from ckptfs import LimitExceededError, Limits
from ckptfs.fs.layout import Layout
from ckptfs.fs.pathtext import PathTexts
from ckptfs.model import trails as trail_cache
from ckptfs.model.encoding import encode_key
from ckptfs.model.records import path_of, short_trail

_keys = st.one_of(st.text(max_size=4), st.integers(-5, 5), st.tuples(st.integers(0, 2)), st.binary(max_size=3),
                  st.none(), st.floats(allow_nan=True))


def _trail(keys: list[Any], base: Any = None) -> Any:
    for key in keys:
        base = (key, base)
    return base


@settings(max_examples=200, deadline=None)
@given(branches=st.lists(st.tuples(st.integers(0, 3), st.lists(_keys, max_size=6)), min_size=1, max_size=12),
       cache=st.integers(1, 8))
def test_texts_equal_encoding_key_by_key(branches: list[tuple[int, list[Any]]], cache: int) -> None:
    """Trails that share prefixes, asked for in any order, with a cache small enough to be cleared often."""
    texts, names = PathTexts(1 << 20), trail_cache.key_lists(str)
    trails: list[Any] = [None]
    for parent, keys in branches:
        trails.append(_trail(keys, trails[parent % len(trails)]))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(trail_cache, "CACHED_TRAILS", cache)
        for trail in trails + trails[::-1]:
            keys = []
            node = trail
            while node is not None:
                keys.append(node[0])
                node = node[1]
            expected = json.dumps([encode_key(k) for k in reversed(keys)])
            assert texts.path_text(trail) == expected
            assert names.leaf(trail) == tuple(str(k) for k in reversed(keys))
            assert names.value(trail) == names.leaf(trail)


@settings(max_examples=200, deadline=None)
@given(parent=st.lists(_keys, max_size=3), keys=st.lists(st.one_of(st.text(max_size=6), _keys), max_size=8),
       others=st.lists(st.lists(_keys, max_size=2), max_size=2))
def test_lengths_equal_the_texts_lengths(parent: list[Any], keys: list[Any], others: list[list[Any]]) -> None:
    """Siblings (a state dict's keys, with escapes or not), and trails of other parents mixed in."""
    base = _trail(parent)
    trails = [(key, base) for key in keys] + [_trail(other) for other in others]
    for asked in (trails[: len(keys)], trails):
        assert PathTexts(1 << 20).lengths(asked) == [len(PathTexts(1 << 20).path_text(t)) for t in asked]


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(st.one_of(st.text(max_size=6), _keys), max_size=8), others=st.lists(st.lists(_keys, max_size=2),
                                                                                          max_size=2))
def test_short_trails_give_the_texts_of_their_pairs(keys: list[Any], others: list[list[Any]]) -> None:
    """A tensor's trail at the root under a str key is that key alone: its text, length and keys are its pair's,
    alone, among siblings and mixed with trails of other parents."""
    pairs = [(key, None) for key in keys] + [_trail(other) for other in others]
    short = [short_trail(trail) for trail in pairs]
    assert [type(t) is str for t in short[: len(keys)]] == [type(key) is str for key in keys]
    for asked, expected in ((short[: len(keys)], pairs[: len(keys)]), (short, pairs)):
        texts = [PathTexts(1 << 20).path_text(t) for t in expected]
        assert [PathTexts(1 << 20).path_text(t) for t in asked] == texts
        assert PathTexts(1 << 20).lengths(asked) == [len(text) for text in texts]
        assert [path_of(t) for t in asked] == [path_of(t) for t in expected]
    assert path_of(short_trail(("k", None))) == ("k",) and path_of(_trail(["a", "b"])) == ("a", "b")


def test_lengths_of_siblings_past_the_limit_fail() -> None:
    trails = [(key, None) for key in ["a", "b" * 999, "c"]]
    assert PathTexts(1003).lengths(trails) == [5, 1003, 5]
    with pytest.raises(LimitExceededError, match=r"key path's JSON text exceeds 1002 bytes"):
        PathTexts(1002).lengths(trails)


def test_a_path_longer_than_the_limit_fails() -> None:
    trail = _trail(["k" * 100] * 20)
    assert len(PathTexts(1 << 20).path_text(trail)) == 20 * 102 + 19 * 2 + 2
    with pytest.raises(LimitExceededError, match=r"key path's JSON text exceeds 1000 bytes \(limit max_generated_bytes\)"):
        PathTexts(1000).path_text(trail)


def test_generated_files_are_bounded(tmp_path: Path) -> None:
    """The index and sidecars of a file whose key paths are long fail with LimitExceededError, nothing else."""
    path = long_paths(tmp_path / "long_paths.pt")
    with ckptfs.open(path, Limits(max_generated_bytes=4000)) as ck:
        layout = Layout(ck)
        (tensor,) = ck.tensors
        assert len(tensor.path) == 31
        node = layout.node_of(tensor)
        assert layout.size(node) == tensor.nbytes
        sidecar = layout.lookup("/" + layout.path_of(node) + ".json")
        assert sidecar is not None
        with pytest.raises(LimitExceededError, match="limit max_generated_bytes"):
            layout.content(sidecar)
        with pytest.raises(LimitExceededError, match="limit max_generated_bytes"):
            layout.index_bytes()
    with ckptfs.open(path, Limits(max_generated_bytes=12000)) as ck:
        with pytest.raises(LimitExceededError, match=r"index.json would exceed 12000 bytes \(limit max_generated_bytes\)"):
            Layout(ck).index_bytes()
    with ckptfs.open(path, Limits(max_generated_bytes=40000)) as ck:
        layout = Layout(ck)
        meta = json.loads(layout.content(layout.lookup("/" + layout.path_of(layout.node_of(ck.tensors[0])) + ".json")))
        assert meta["path"] == ["k" * 200] * 31
        assert json.loads(layout.index_bytes())["tensors"][0]["path"] == ["k" * 200] * 31
