"""Cache entries that are truncated, corrupt or hostile: never an error for the user, never trusted.

A byte changed anywhere fails the entry's digest: it is discarded, the checkpoint parsed and the entry written
anew. An entry whose digest was made to match (a hostile writer of the cache folder) is checked value by value:
opening it either gives a checkpoint whose every read works or fails with a ckptfs error, or discards it.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from corpus import CorpusFile, save_zip

from ckptfs.cache import source_key
from ckptfs.cache.entry_file import decode_entry, encode_entry
from ckptfs.cache.errors import BadEntry
from ckptfs.cache.parsed_codec import decode_parsed
from ckptfs.checkpoint import open_checkpoint
from ckptfs.errors import CkptfsError
from ckptfs.limits import Limits
from ckptfs.sources import LocalFileSource

from cache.fingerprint import fingerprint
from cache.helpers import entries
from hostile.fuzz_cache import mutate_sections


def entry_of(path: Path, cache_dir: Path) -> tuple[Path, bytes, Any]:
    with open_checkpoint(path, cache_dir=cache_dir) as ck:
        reference = fingerprint(ck)
    (entry,) = entries(cache_dir)
    return entry, entry.read_bytes(), reference


def key_of(path: Path, limits: Limits = Limits()) -> str:
    source = LocalFileSource(path)
    try:
        key = source_key(source, limits)
    finally:
        source.close()
    assert key is not None
    return key


def open_and_read(path: Path, cache_dir: Path) -> Any:
    with open_checkpoint(path, cache_dir=cache_dir) as ck:
        for tensor in ck.tensors:
            if tensor.has_data:
                ck.read(tensor)
        return fingerprint(ck)


@pytest.fixture
def checkpoint(corpus: dict[str, CorpusFile]) -> Path:
    return corpus["r1_views_containers"].path


@pytest.mark.parametrize("damage", ["truncate", "flip", "append", "empty", "other_key", "other_version"])
def test_a_damaged_entry_is_discarded_and_written_anew(checkpoint: Path, cache_dir: Path, damage: str) -> None:
    entry, good, reference = entry_of(checkpoint, cache_dir)
    rng = random.Random(damage)
    for _ in range(20):
        data = bytearray(good)
        if damage == "truncate":
            data = data[: rng.randrange(len(data))]
        elif damage == "flip":
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif damage == "append":
            data += b"\0"
        elif damage == "empty":
            data = bytearray()
        elif damage == "other_key":
            data = bytearray(encode_entry("another key", decode_entry(key_of(checkpoint), bytes(good))))
        else:
            data[8] += 1
        entry.write_bytes(bytes(data))
        assert open_and_read(checkpoint, cache_dir) == reference
        assert entry.read_bytes() == good


@pytest.mark.parametrize("name", ["r1_views_containers", "r2_every_dtype", "r5_scripted"])
def test_hostile_entries_with_a_matching_digest(corpus: dict[str, CorpusFile], name: str, cache_dir: Path) -> None:
    path = corpus[name].path
    entry, good, reference = entry_of(path, cache_dir)
    key = key_of(path)
    sections = decode_entry(key, good)
    rng = random.Random(name)
    for _ in range(150):
        hostile = mutate_sections(sections, rng)
        entry.write_bytes(encode_entry(key, hostile))
        try:
            opened = open_and_read(path, cache_dir)
        except CkptfsError:
            continue
        if not entry.exists() or entry.read_bytes() == good:
            assert opened == reference


def test_another_files_entry_is_not_used(tmp_path: Path, cache_dir: Path) -> None:
    """An entry renamed to another file's key name still names its own key inside: a miss."""
    a = save_zip({"a": torch.ones(3)}, tmp_path / "a.pt")
    b = save_zip({"b": torch.zeros(5)}, tmp_path / "b.pt")
    entry_a, _, _ = entry_of(a, cache_dir)
    entry_b = cache_dir / "metadata" / "b"
    with open_checkpoint(b, cache_dir=cache_dir) as ck:
        reference = fingerprint(ck)
    (entry_b,) = [e for e in entries(cache_dir) if e != entry_a]
    os.replace(entry_a, entry_b)
    assert open_and_read(b, cache_dir) == reference


@pytest.mark.parametrize("limits", [Limits(max_tensors=1), Limits(max_tree_nodes=3), Limits(max_zip_entries=1)])
def test_an_entry_is_held_to_the_limits_before_it_is_decoded(checkpoint: Path, cache_dir: Path,
                                                              limits: Limits) -> None:
    _, good, _ = entry_of(checkpoint, cache_dir)
    key = key_of(checkpoint)
    source = LocalFileSource(checkpoint)
    try:
        with pytest.raises(BadEntry, match="than the limits allow"):
            decode_parsed(decode_entry(key, good), source, limits)
    finally:
        source.close()
