"""A checkpoint opened from its cache entry is indistinguishable from its parse: the whole object tree,
`info --json`, `ls --json`, the mount's index.json and every tensor's bytes."""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch
from corpus import CORPUS_NAMES, CorpusFile, save_zip

import ckptfs.checkpoint
from ckptfs.checkpoint import Checkpoint, open_checkpoint
from ckptfs.cli.info import description_text
from ckptfs.cli.listing import json_lines, listed
from ckptfs.fs.index import make_index
from ckptfs.fs.layout import Layout

from cache.fingerprint import fingerprint
from cache.helpers import entries

CACHED_FORMATS = {"zip", "torchscript", "legacy", "pt2"}


class Odd:
    """A class the pickle names: an inert object in ckptfs' tree."""

    def __init__(self, payload: Any) -> None:
        self.payload = payload


def views(ck: Checkpoint) -> dict[str, Any]:
    return {
        "tree": fingerprint(ck),
        "info": description_text(ck),
        "ls": "".join(json_lines(listed(ck), ck.limits.max_generated_bytes)),
        "index": json.loads(make_index(Layout(ck))),
        "bytes": [ck.read(t) if t.has_data else None for t in ck.tensors],
    }


def open_twice(path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, Any], dict[str, Any]]:
    """The views of the parse (which writes the entry) and of the open that reads the entry, never the pickle."""
    with open_checkpoint(path, cache_dir=cache_dir) as ck:
        parsed = views(ck)
    if not entries(cache_dir):
        return parsed, parsed
    with monkeypatch.context() as patch:
        patch.setattr(ckptfs.checkpoint, "open_parsed", _no_parse)
        with open_checkpoint(path, cache_dir=cache_dir) as ck:
            cached = views(ck)
    return parsed, cached


def _no_parse(*args: Any) -> Any:
    raise AssertionError("parsed although the cache holds the checkpoint")


@pytest.mark.parametrize("name", CORPUS_NAMES)
def test_corpus_file_from_the_cache(corpus: dict[str, CorpusFile], name: str, cache_dir: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    parsed, cached = open_twice(corpus[name].path, cache_dir, monkeypatch)
    assert len(entries(cache_dir)) == (corpus[name].format in CACHED_FORMATS)
    assert cached == parsed


def test_odd_values_survive(tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loop: list[Any] = [1]
    loop.append(loop)
    shared = (1, "two")
    weights = torch.arange(6, dtype=torch.float32)
    obj = OrderedDict(
        numbers=[0, -1, 2**63 - 1, -(2**63), 2**63, -(2**200), 1.5, -0.0, math.nan, math.inf, 3 - 4j, True, None],
        texts=["", "é", "\udcff lone surrogate", "a\0b"],
        raw=[b"", b"\x00\xff", bytearray(b"mutable")],
        sets=[{1, 2, "x"}, frozenset({(1, 2), "y"}), set()],
        shared=[shared, shared, {shared: weights}],
        loop=loop,
        odd=Odd({"w": weights, "view": weights[1:3], "strided": weights[::2]}),
        empty=[torch.empty(0), torch.zeros(0, dtype=torch.float16), (), {}],
    )
    path = save_zip(obj, tmp_path / "odd.pt")
    parsed, cached = open_twice(path, cache_dir, monkeypatch)
    assert len(entries(cache_dir)) == 1
    assert cached == parsed


def test_other_formats_are_not_cached(tmp_path: Path, cache_dir: Path) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    path = tmp_path / "w.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + bytes(8))
    with open_checkpoint(path, cache_dir=cache_dir) as ck:
        assert ck.format == "safetensors"
    assert entries(cache_dir) == []


def test_without_a_cache_dir_nothing_is_written(corpus: dict[str, CorpusFile], cache_dir: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_dir))
    with open_checkpoint(corpus["r2_every_dtype"].path):
        pass
    assert not cache_dir.exists()

