"""Metadata cache entries of torch.distributed.checkpoint directories: opened from the entry, a directory is its
parse (tree, info, ls, index, every tensor's bytes, torch's own values); any file of it changed is a miss."""

from __future__ import annotations

import os
import random
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from dcp_writers import raw_bytes, save, simulate_ranks, simulate_ranks_without_collectives
from remote_servers import Nginx, nginx  # noqa: F401  (fixture)

import ckptfs.checkpoint
from ckptfs.cache import source_key
from ckptfs.cache.entry_file import decode_entry, encode_entry
from ckptfs.checkpoint import open_checkpoint
from ckptfs.errors import CkptfsError
from ckptfs.limits import Limits
from ckptfs.sources import DirectorySource

from cache.helpers import entries, hostile_outcome
from cache.test_cached_equals_parsed import open_twice, views


def state() -> dict[str, Any]:
    gen = torch.Generator().manual_seed(5)
    return {
        "model": {"w": torch.randn(8, 6, generator=gen), "b": torch.arange(6, dtype=torch.int16),
                  "layers": [torch.ones(3, dtype=torch.bfloat16), torch.zeros(2, 2)]},
        "step": 7, "name": "run", "lr": [0.1, 0.01],
    }


def comparable(seen: dict[str, Any]) -> dict[str, Any]:
    """The views with the addresses of sources left out (a chunk's tensor, once read, names its file's)."""
    return {**seen, "tree": re.sub(r" object at 0x[0-9a-f]+", "", str(seen["tree"]))}


def no_parse(*args: Any) -> Any:
    raise AssertionError("parsed although the cache holds the checkpoint")


@pytest.mark.parametrize("layout", ["one rank", "four ranks", "zstd", "per-rank metadata"])
def test_a_directory_from_the_cache_is_its_parse(tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                 layout: str) -> None:
    path = tmp_path / "ckpt"
    tensors = state()
    if layout == "one rank":
        save(tensors, path)
    elif layout == "zstd":
        from torch.distributed.checkpoint._extension import ZStandard

        save(tensors, path, _extensions=[ZStandard()])
    elif layout == "four ranks":
        simulate_ranks(tensors, {"model.w": (0, 4), "model.b": (0, 3)}, path, 4)
    else:
        simulate_ranks_without_collectives(tensors, {"model.w": (1, 2)}, path, 2)
    parsed, cached = open_twice(path, cache_dir, monkeypatch)
    assert len(entries(cache_dir)) == 1
    assert comparable(cached) == comparable(parsed)
    assert cached["bytes"] == [raw_bytes(t) for t in (tensors["model"]["w"], tensors["model"]["b"],
                                                      *tensors["model"]["layers"])]


def test_any_file_changed_is_a_miss(tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ckpt"
    save(state(), path)
    open_twice(path, cache_dir, monkeypatch)
    for change in ("touch a data file", "add a file", "save again"):
        if change == "touch a data file":
            data = next(path.glob("*.distcp"))
            os.utime(data, ns=(data.stat().st_atime_ns, data.stat().st_mtime_ns + 1))
        elif change == "add a file":
            (path / "notes.txt").write_text("hi")
        else:
            tensors = state()
            tensors["model"]["b"] = -tensors["model"]["b"]
            save(tensors, path)
        with monkeypatch.context() as patch:
            patch.setattr(ckptfs.checkpoint, "open_parsed", no_parse)
            with pytest.raises(AssertionError, match="parsed although"):
                open_checkpoint(path, cache_dir=cache_dir)
        with open_checkpoint(path, cache_dir=cache_dir) as ck:
            b = views(ck)["bytes"][1]
    assert b == raw_bytes(-state()["model"]["b"])


def test_an_http_prefix_is_keyed_by_its_metadata_version(nginx: Nginx, cache_dir: Path,  # noqa: F811
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    path = nginx.root / "cached-dcp"
    tensors = state()
    simulate_ranks(tensors, {"model.w": (0, 2)}, path, 2)
    url = f"{nginx.url}/cached-dcp/"
    with open_checkpoint(url, cache_dir=cache_dir) as ck:
        parsed = views(ck)
    mark = nginx.mark()
    with monkeypatch.context() as patch:
        patch.setattr(ckptfs.checkpoint, "open_parsed", no_parse)
        with open_checkpoint(url, cache_dir=cache_dir) as ck:
            opened = nginx.since(mark, at_least=1)
            cached = views(ck)
    assert comparable(cached) == comparable(parsed)
    assert [(r.path, r.range[:7]) for r in opened] == [("/cached-dcp/.metadata", "bytes=-")]
    tensors["model"]["b"] = torch.arange(9, dtype=torch.int16)
    simulate_ranks(tensors, {"model.w": (0, 2)}, path, 2)
    future = time.time() + 10
    os.utime(path / ".metadata", (future, future))  # nginx's ETag is its mtime (in seconds) and size
    with open_checkpoint(url, cache_dir=cache_dir) as ck:
        assert ck.read(ck.tensor(("model", "b"))) == raw_bytes(tensors["model"]["b"])
    assert len(entries(cache_dir)) == 2


CHUNK_VALUES = (-1, 0, 1, 2, 3, 7, 8, 1 << 20, 1 << 40, (1 << 63) - 1, -(1 << 63))


def test_hostile_directory_entries_with_a_matching_digest(tmp_path: Path, cache_dir: Path) -> None:
    """Entries whose digest was made to match, their chunk columns (and the rest) changed: opening one gives
    a checkpoint whose reads work or fail with a ckptfs error, or the entry is discarded and the parse used."""
    path = tmp_path / "ckpt"
    simulate_ranks(state(), {"model.w": (0, 4), "model.b": (0, 3)}, path, 4)
    with open_checkpoint(path, cache_dir=cache_dir) as ck:
        reference = comparable(views(ck))
    (entry,) = entries(cache_dir)
    good = entry.read_bytes()
    source = DirectorySource(path)
    key = source_key(source, Limits())
    source.close()
    assert key is not None
    sections = decode_entry(key, good)
    rng = random.Random(14)
    chunk_sections = sorted(name for name in sections if name.startswith(("chunk_", "tensor_")))
    outcomes = set()
    for _ in range(300):
        hostile = dict(sections)
        name = rng.choice(chunk_sections if rng.random() < 0.8 else sorted(sections))
        value = hostile[name]
        if isinstance(value, np.ndarray):
            value = value.copy()
            if len(value) and rng.random() < 0.85:
                value[rng.randrange(len(value))] = rng.choice(CHUNK_VALUES)
            else:
                value = value[: rng.randrange(len(value) + 1)]
        else:
            value = value[: rng.randrange(len(value) + 1)]
        hostile[name] = value
        entry.write_bytes(encode_entry(key, hostile))
        outcomes.add(hostile_outcome(path, cache_dir, entry, good, reference, read_and_view))
    assert {"discarded", "used"} <= outcomes


def read_and_view(ck: Any) -> dict[str, Any]:
    """The checkpoint's views once every tensor was read (or refused with a ckptfs error)."""
    for tensor in ck.tensors:
        try:
            ck.read(tensor)
        except CkptfsError:
            pass
    return comparable(views_or_none(ck))


def views_or_none(ck: Any) -> dict[str, Any]:
    try:
        return views(ck)
    except CkptfsError:
        return {"tree": None}
