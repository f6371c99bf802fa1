"""The cache's folder and key: entries private to their owner, replaced atomically, trimmed least recently
used first; any change of the file, the entry format or the limits is a miss."""

from __future__ import annotations

import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from corpus import save_zip
from many_tensors import save_many

import ckptfs.cache
import ckptfs.checkpoint
from ckptfs.cache.entry_file import decode_entry, encode_entry
from ckptfs.cache.store import TEMP_PREFIX, MetadataStore
from ckptfs.checkpoint import open_checkpoint
from ckptfs.limits import Limits
from ckptfs.pickle import cscan

from cache.helpers import entries


class CountingParse:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        self.parse = ckptfs.checkpoint.open_parsed
        monkeypatch.setattr(ckptfs.checkpoint, "open_parsed", self)

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        return self.parse(*args)


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> CountingParse:
    return CountingParse(monkeypatch)


@pytest.fixture
def small(tmp_path: Path) -> Path:
    return save_zip({"w": torch.arange(4.0), "b": torch.ones(2, dtype=torch.int8)}, tmp_path / "small.pt")


def test_entries_are_private_files(small: Path, cache_dir: Path) -> None:
    open_checkpoint(small, cache_dir=cache_dir).close()
    (entry,) = entries(cache_dir)
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600
    assert stat.S_IMODE(entry.parent.stat().st_mode) == 0o700
    assert [p.name for p in entry.parent.iterdir()] == [entry.name]  # no temporary file left


def test_a_repeat_open_reads_the_entry(small: Path, cache_dir: Path, parses: CountingParse) -> None:
    for _ in range(3):
        open_checkpoint(small, cache_dir=cache_dir).close()
    assert parses.calls == 1


def test_any_change_of_the_file_is_a_miss(small: Path, cache_dir: Path, parses: CountingParse) -> None:
    open_checkpoint(small, cache_dir=cache_dir).close()
    info = small.stat()
    os.utime(small, ns=(info.st_atime_ns, info.st_mtime_ns + 1))
    with open_checkpoint(small, cache_dir=cache_dir) as ck:
        assert ck.read(ck.tensors[0]) == torch.arange(4.0).numpy().tobytes()
    replaced = save_zip({"w": torch.arange(5.0)}, small.with_name("other.pt"))
    os.replace(replaced, small)  # another inode at the same path
    with open_checkpoint(small, cache_dir=cache_dir) as ck:
        assert ck.tensors[0].shape == (5,)
    assert parses.calls == 3


def test_other_limits_are_a_miss(small: Path, cache_dir: Path, parses: CountingParse) -> None:
    open_checkpoint(small, cache_dir=cache_dir).close()
    open_checkpoint(small, Limits(max_tensors=10), cache_dir=cache_dir).close()
    open_checkpoint(small, Limits(max_tensors=10), cache_dir=cache_dir).close()
    assert parses.calls == 2 and len(entries(cache_dir)) == 2


def test_small_checkpoints_are_not_cached(small: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ckptfs.cache, "MIN_TENSORS", 3)
    open_checkpoint(small, cache_dir=cache_dir).close()
    assert entries(cache_dir) == []


def test_a_folder_of_another_user_is_not_used(small: Path, tmp_path: Path, parses: CountingParse) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give the folder away")
    folder = tmp_path / "cache" / "metadata"
    folder.mkdir(parents=True)
    os.chown(folder, 65534, 65534)
    for _ in range(2):
        open_checkpoint(small, cache_dir=tmp_path / "cache").close()
    assert parses.calls == 2 and list(folder.iterdir()) == []


def test_the_folder_is_trimmed_least_recently_used_first(tmp_path: Path) -> None:
    store = MetadataStore(tmp_path, max_bytes=3500)
    for name in "abc":
        store.write(name, bytes(1000))
        os.utime(store.path(name), ns=(0, {"a": 3, "b": 1, "c": 2}[name] * 10**9))
    store.read("b")  # used now: the newest
    store.write("d", bytes(1000))
    kept = {name for name in "abcd" if store.path(name).exists()}
    assert kept == {"a", "b", "d"}


def test_stale_temporary_files_are_removed(tmp_path: Path) -> None:
    store = MetadataStore(tmp_path)
    stale, fresh = store.folder / f"{TEMP_PREFIX}stale", store.folder / f"{TEMP_PREFIX}fresh"
    stale.write_bytes(b"x")
    fresh.write_bytes(b"x")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    store.write("a", b"entry")
    assert not stale.exists() and fresh.exists()


def test_concurrent_writers_never_show_a_partial_entry(tmp_path: Path) -> None:
    store = MetadataStore(tmp_path)
    payloads = [encode_entry("k", {"data": bytes([i]) * 200_000}) for i in range(2)]
    seen: list[bytes | None] = []
    stop = threading.Event()

    def write(data: bytes) -> None:
        while not stop.is_set():
            store.write("k", data)

    writers = [threading.Thread(target=write, args=(p,)) for p in payloads]
    for w in writers:
        w.start()
    try:
        for _ in range(200):
            seen.append(store.read("k"))
    finally:
        stop.set()
        for w in writers:
            w.join()
    for data in seen:
        assert data is None or decode_entry("k", data)["data"] in (bytes([0]) * 200_000, bytes([1]) * 200_000)
    assert not [p for p in store.folder.iterdir() if p.name.startswith(TEMP_PREFIX)]


def test_many_tensors_are_cached_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cscan, "ENABLED", False)  # the compiled scanner's zips are cached from more tensors on
    path = save_many(tmp_path / "many.pt", ckptfs.cache.MIN_TENSORS)
    with open_checkpoint(path, cache_dir=tmp_path / "cache") as parsed:
        shapes = [(t.path, t.dtype.name, t.shape) for t in parsed.tensors]
    assert len(entries(tmp_path / "cache")) == 1
    with open_checkpoint(path, cache_dir=tmp_path / "cache") as cached:
        assert [(t.path, t.dtype.name, t.shape) for t in cached.tensors] == shapes


@pytest.mark.skipif(cscan.LIBRARY is None, reason="the compiled scanner is not built")
def test_zips_the_compiled_scanner_reads_are_cached_from_more_tensors(tmp_path: Path) -> None:
    assert ckptfs.cache.min_tensors("zip", True) == ckptfs.cache.MIN_TENSORS_SCANNED["zip"] > ckptfs.cache.MIN_TENSORS
    assert ckptfs.cache.min_tensors("zip", False) == ckptfs.cache.min_tensors("legacy", True) == ckptfs.cache.MIN_TENSORS
    path = save_many(tmp_path / "many.pt", ckptfs.cache.MIN_TENSORS)
    with open_checkpoint(path, cache_dir=tmp_path / "cache") as parsed:
        assert len(parsed.tensors) == ckptfs.cache.MIN_TENSORS
    assert entries(tmp_path / "cache") == []
