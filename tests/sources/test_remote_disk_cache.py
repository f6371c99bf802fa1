"""The on-disk block cache of remote objects (--cache-dir), against a real nginx: requests counted in its log."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from remote_servers import Nginx, Request

import ckptfs
from ckptfs.sources import DiskCacheSetting, RemoteOptions, open_source
from ckptfs.sources.remote.disk_cache import HEADER, UNIT, object_identity

MiB = 1 << 20


def cached(cache: Path, capacity: int = 1 << 30) -> RemoteOptions:
    """A disk cache in ``cache``; the opening suffix GET (held in memory, not on disk) of 1 MiB."""
    return RemoteOptions(storage_options={"tail_size": "1MiB"}, disk_cache=DiskCacheSetting(cache, capacity))


def blocks(cache: Path) -> list[Path]:
    return sorted(p for p in (cache / "blocks").rglob("*") if p.is_file())


def test_a_second_open_reads_from_disk_with_no_get(nginx: Nginx, tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(3)
    tensors = {"a": torch.randn(1 << 20, generator=generator), "b": torch.randn(3000, generator=generator)}
    torch.save(tensors, nginx.root / "disk-cached.pt")
    url = f"{nginx.url}/disk-cached.pt"
    with ckptfs.open(url, remote=cached(tmp_path)) as ck:
        assert ck.read(ck.tensor(("a",))) == tensors["a"].numpy().tobytes()
    assert len(blocks(tmp_path)) == 4 and all(p.stat().st_mode & 0o777 == 0o600 for p in blocks(tmp_path))
    assert (tmp_path / "blocks").stat().st_mode & 0o777 == 0o700
    mark = nginx.mark()
    with ckptfs.open(url, remote=cached(tmp_path)) as ck:
        opened = nginx.mark()
        assert ck.read(ck.tensor(("a",))) == tensors["a"].numpy().tobytes()
        assert nginx.mark() == opened  # the tensor (and its zip local header) came from disk
    assert len(nginx.since(mark)) == 1  # the suffix GET, which pins the version


def test_a_replaced_object_misses_and_never_gets_the_old_bytes(nginx: Nginx, tmp_path: Path) -> None:
    path = nginx.root / "disk-replaced.bin"
    old = os.urandom(5 * MiB)
    path.write_bytes(old)
    url = f"{nginx.url}/disk-replaced.bin"
    assert open_source(url, cached(tmp_path)).read(0, 3 * MiB) == old[: 3 * MiB]
    new = os.urandom(5 * MiB)
    path.write_bytes(new)
    os.utime(path, (time.time() + 10, time.time() + 10))  # nginx's ETag is mtime and size
    source = open_source(url, cached(tmp_path))
    mark = nginx.mark()
    assert source.read(0, 3 * MiB) == new[: 3 * MiB]
    assert sum(r.sent for r in nginx.since(mark)) >= 3 * MiB
    assert len({p.parent for p in blocks(tmp_path)}) == 2  # one folder per version


def test_a_damaged_block_is_discarded_and_fetched_again(nginx: Nginx, tmp_path: Path) -> None:
    path = nginx.root / "disk-damaged.bin"
    raw = os.urandom(4 * MiB + 1234)
    path.write_bytes(raw)
    url = f"{nginx.url}/disk-damaged.bin"
    assert open_source(url, cached(tmp_path)).read(0, len(raw) - 10) == raw[:-10]
    files = {int(p.name): p for p in blocks(tmp_path)}
    assert sorted(files) == [0, 1, 2, 3]  # the last, short one lies in the suffix GET, held in memory
    flipped = bytearray(files[1].read_bytes())
    flipped[HEADER.size + 77] ^= 1
    files[1].write_bytes(flipped)
    files[2].write_bytes(files[2].read_bytes()[: UNIT // 2])  # torn
    source = open_source(url, cached(tmp_path))
    mark = nginx.mark()
    assert source.read(0, len(raw) - 10) == raw[:-10]
    # Only the two bad blocks again, once each, in as many parts as the measured rate asks for
    assert covered(nginx.since(mark)) == [(UNIT, 3 * UNIT - 1)]
    assert files[1].read_bytes()[HEADER.size:] == raw[UNIT : 2 * UNIT]  # written again, whole


def test_the_folder_is_bounded_least_recently_used_first(nginx: Nginx, tmp_path: Path) -> None:
    path = nginx.root / "disk-bounded.bin"
    raw = os.urandom(12 * MiB)
    path.write_bytes(raw)
    url = f"{nginx.url}/disk-bounded.bin"
    assert open_source(url, cached(tmp_path, capacity=8 * MiB)).read(0, 6 * MiB) == raw[: 6 * MiB]
    for block in blocks(tmp_path):  # written in this order, an hour ago (mtimes are coarser than the writes)
        os.utime(block, (time.time() - 3600 + int(block.name), time.time() - 3600 + int(block.name)))
    source = open_source(url, cached(tmp_path, capacity=8 * MiB))
    assert source.read(0, 100) == raw[:100]  # a hit: block 0 is now the most recently used
    for at in range(6 * MiB, 11 * MiB, MiB):  # the last MiB came with the suffix GET
        assert source.read(at, MiB) == raw[at : at + MiB]
    kept = sorted(int(p.name) for p in blocks(tmp_path))
    assert sum(p.stat().st_size for p in blocks(tmp_path)) <= 8 * MiB
    assert kept == [0, 5, 6, 7, 8, 9, 10], kept  # an eviction frees down to 90%: 7 blocks and headers


def test_only_objects_whose_version_is_known_are_cached() -> None:
    assert object_identity("http://h/x", 10, '"5f-a"', None) is not None
    assert object_identity("http://h/x", 10, None, "v1") is not None
    assert object_identity("http://h/x", 10, 'W/"5f-a"', None) is None  # a weak ETag names no exact bytes
    assert object_identity("http://h/x", 10, None, None) is None


def test_an_object_folder_an_eviction_empties_is_removed(nginx: Nginx, tmp_path: Path) -> None:
    old, new = nginx.root / "disk-evicted-old.bin", nginx.root / "disk-evicted-new.bin"
    old_bytes, new_bytes = os.urandom(4 * MiB), os.urandom(8 * MiB)
    old.write_bytes(old_bytes)
    new.write_bytes(new_bytes)
    options = cached(tmp_path, capacity=6 * MiB)
    assert open_source(f"{nginx.url}/disk-evicted-old.bin", options).read(0, 2 * MiB) == old_bytes[: 2 * MiB]
    folders = [p for p in (tmp_path / "blocks").iterdir() if p.is_dir()]
    assert len(folders) == 1
    for block in blocks(tmp_path):  # the old object's blocks are the least recently used
        os.utime(block, (time.time() - 3600, time.time() - 3600))
    source = open_source(f"{nginx.url}/disk-evicted-new.bin", options)
    assert source.read(0, 6 * MiB) == new_bytes[: 6 * MiB]
    assert not folders[0].exists()
    assert [p for p in (tmp_path / "blocks").iterdir()] == [blocks(tmp_path)[0].parent]
    assert source.read(0, 6 * MiB) == new_bytes[: 6 * MiB]


def covered(requests: list[Request]) -> list[tuple[int, int]]:
    """The byte spans the ranged GETs fetched, adjacent ones joined; AssertionError if two overlap."""
    spans = sorted(tuple(map(int, request.range.removeprefix("bytes=").split("-"))) for request in requests)
    joined: list[tuple[int, int]] = []
    for start, end in spans:
        if joined and start <= joined[-1][1]:
            raise AssertionError(f"bytes {start}-{end} fetched twice: {spans}")
        if joined and start == joined[-1][1] + 1:
            joined[-1] = (joined[-1][0], end)
        else:
            joined.append((start, end))
    return joined
