"""Parallel ranged GETs (``sources.remote.parts``): parts in flight follow a connection's measured rate up to
``max_connections``, read-ahead never passes a storage's end, and a fault or another version on one connection
is retried or refused there, with no wrong byte."""

from __future__ import annotations

import os
import re
import time
from itertools import count

import pytest
import torch
from remote_servers import FaultProxy, Nginx, timed_gets

import ckptfs
from ckptfs.errors import ObjectChangedError
from ckptfs.sources import RemoteOptions, open_source
from ckptfs.sources.remote.cache import BLOCK, PART, ExtentCache
from ckptfs.sources.remote.http_endpoint import HttpEndpoint
from ckptfs.sources.remote.parts import MIN_PARTS, PartPool
from ckptfs.sources.remote.ranged_get import RangedGetter
from ckptfs.sources.remote.retry import RetryPolicy

MiB = 1 << 20


@pytest.fixture(scope="module")
def blob(nginx: Nginx) -> bytes:
    data = os.urandom(64 * MiB)
    (nginx.root / "parts.bin").write_bytes(data)
    return data


def test_parts_in_flight_follow_a_connection_rate_up_to_the_bound(nginx: Nginx, blob: bytes) -> None:
    getter = RangedGetter(HttpEndpoint(f"{nginx.url}/parts.bin"), RetryPolicy(), 10.0)
    getter.get_tail(BLOCK)
    for seconds, connections, parts in ((0.2, 4, 4), (0.2, 16, 16), (0.05, 16, 6), (0.004, 16, MIN_PARTS)):
        clock = count(0.0, seconds)  # every GET takes ``seconds``: a connection's rate, made up
        pool = PartPool(getter, connections, clock=lambda: next(clock))
        assert pool.parts() == MIN_PARTS  # nothing measured yet
        view = memoryview(bytearray(PART))
        pool.fetch(3 * PART, view)
        assert view == blob[3 * PART : 4 * PART]
        assert pool.rate() == PART / seconds
        assert pool.parts() == parts, seconds  # 1 GB/s over PART / seconds, within MIN_PARTS and the bound
        small = memoryview(bytearray(BLOCK))
        pool.fetch(5, small)  # latency, mostly: not a rate
        assert small == blob[5 : 5 + BLOCK] and pool.parts() == parts
        pool.close()
    getter.close()


def test_a_slow_stream_keeps_more_parts_ahead_but_never_past_its_tensor(nginx: Nginx) -> None:
    generator = torch.Generator().manual_seed(25)
    tensors = {"big": torch.randn(24 << 20, generator=generator), "next": torch.randn(4 << 20, generator=generator)}
    torch.save(tensors, nginx.root / "slow-stream.pt")
    source = open_source(f"{nginx.url}/slow-stream.pt", RemoteOptions(max_connections=4, cache_size=256 * MiB))
    with ckptfs.open(source) as ck:
        big = ck.tensor(("big",))
        assert big.storage is not None
        timed_gets(source, 0.25)  # ~34 MB/s a connection: behind a per-connection cap
        mark = nginx.mark()
        data = b"".join(ck.read(big, at, MiB) for at in range(0, big.nbytes, MiB))
        assert data == tensors["big"].numpy().tobytes()
        assert source._ahead.max_window == 6 * PART  # noqa: SLF001  (4 in flight, half as many again; 16 MiB if fast)
        requests = nginx.since(mark)
    ranges = [tuple(map(int, re.findall(r"\d+", r.range))) for r in requests]
    big_end = big.storage.offset + big.nbytes
    assert all(r.status == 206 and r.if_match for r in requests)
    assert max(last for _, last in ranges) < -(-big_end // BLOCK) * BLOCK, ranges  # not into "next"
    assert sum(r.sent for r in requests) <= big.nbytes + 2 * BLOCK  # each byte once
    sizes = [r.sent for r in requests]
    # Small parts while little was read (a window of what was read, 4 parts of it at once), larger as it grows.
    assert sizes[0] <= 2 * MiB + BLOCK and PART // 2 < max(sizes) <= PART + BLOCK, sizes


def test_one_large_read_goes_in_parts_on_at_most_max_connections(fault_proxy: FaultProxy, blob: bytes) -> None:
    source = open_source(f"{fault_proxy.url}/parts.bin", RemoteOptions(cache_size=32 * MiB, max_connections=3))
    fault_proxy.seen.clear()
    assert source.read(0, 56 * MiB) == blob[: 56 * MiB]  # more than a quarter of the cache: straight into the result
    assert sorted(r for r, _ in fault_proxy.seen) == sorted(f"bytes={a}-{a + PART - 1}" for a in range(0, 56 * MiB, PART))
    assert 1 <= fault_proxy.most_active <= 3
    assert len(source._parts._threads) <= 3  # noqa: SLF001
    source.close()


@pytest.mark.parametrize("fault", ["503", "reset", "short"])
def test_a_fault_on_one_part_is_retried_there(fault_proxy: FaultProxy, blob: bytes, fault: str) -> None:
    source = open_source(f"{fault_proxy.url}/parts.bin", RemoteOptions(cache_size=32 * MiB))
    fault_proxy.seen.clear()
    fault_proxy.faults = ["", "", fault, "", fault]
    assert source.read(8 * MiB, 48 * MiB) == blob[8 * MiB : 56 * MiB]
    parts = sorted(f"bytes={a}-{a + PART - 1}" for a in range(8 * MiB, 56 * MiB, PART))
    faulty = [r for r, f in fault_proxy.seen if f == fault]
    assert len(faulty) == 2 and len(fault_proxy.seen) == len(parts) + 2
    assert sorted(set(r for r, _ in fault_proxy.seen)) == parts  # each fault's part asked again, whole
    source.close()


def test_another_version_on_one_part_is_refused_with_no_byte_of_it(fault_proxy: FaultProxy, blob: bytes) -> None:
    source = open_source(f"{fault_proxy.url}/parts.bin", RemoteOptions(cache_size=32 * MiB))
    result = bytearray(b"\0" * 16)
    fault_proxy.faults = ["", "", "", "other-etag"]
    with pytest.raises(ObjectChangedError, match=r"parts\.bin: the object was replaced since it was opened "
                                                  r'\(now 67108864 bytes, ETag "another-version"\)'):
        result[:] = source.read(0, 48 * MiB)
    assert result == bytearray(16)  # nothing returned
    assert [f for _, f in fault_proxy.seen].count("other-etag") == 1  # refused, not retried
    assert source.read(0, 48 * MiB) == blob[: 48 * MiB]  # the pinned version's bytes, all of them
    source.close()


def test_a_stream_over_a_replaced_object_gives_the_first_version_or_an_error(nginx: Nginx) -> None:
    path = nginx.root / "replaced-stream.bin"
    first = os.urandom(64 * MiB)
    path.write_bytes(first)
    replacement = nginx.root / "replacement.bin"
    source = open_source(f"{nginx.url}/replaced-stream.bin", RemoteOptions(max_connections=4))
    timed_gets(source, 0.25)  # many parts in flight: 48 MiB ahead at most, the last 8 MiB unfetched at the change
    at = 0
    while at < 8 * MiB:
        assert source.read(at, MiB) == first[at : at + MiB]
        at += MiB
    replacement.write_bytes(os.urandom(64 * MiB))
    os.utime(replacement, (time.time() + 10, time.time() + 10))  # nginx's ETag is mtime and size
    os.replace(replacement, path)  # as an object store does: a GET under way sends the version it began with
    with pytest.raises(ObjectChangedError, match=r"replaced-stream\.bin: the object was replaced since it was opened"):
        while at < 64 * MiB:
            assert source.read(at, MiB) == first[at : at + MiB]  # fetched before: the first version's
            at += MiB
    assert at < 64 * MiB
    assert source.read(0, MiB) == first[:MiB]
    source.close()


def test_fetches_under_way_count_in_the_cache_bound() -> None:
    cache = ExtentCache(4 * MiB)
    cache.put(0, b"a" * (2 * MiB))
    cache.put(2 * MiB, b"b" * (2 * MiB))
    cache.reserve(3 * MiB)  # a fetch under way: room is made as it starts, the least recently used out
    assert cache.gaps(0, 4 * MiB) == [(0, 4 * MiB)]
    cache.put(8 * MiB, memoryview(bytearray(b"c" * (3 * MiB))), reserved=True)
    cache.reserve(1 * MiB)
    cache.release(1 * MiB)  # a failed fetch gives its room back
    cache.put(0, b"d" * MiB)
    assert cache.held(8 * MiB, 11 * MiB) == b"c" * (3 * MiB) and cache.held(0, MiB) == b"d" * MiB
    assert cache._bytes == 4 * MiB  # noqa: SLF001


def test_extents_read_to_their_end_go_before_read_ahead_not_read_yet() -> None:
    cache = ExtentCache(4 * MiB)
    for i in range(4):
        cache.put(i * MiB, bytes([i]) * MiB)
    assert cache.held(0, MiB) == b"\0" * MiB  # read to its end: a stream went past it
    assert cache.held(MiB, MiB + 10) == b"\1" * 10  # read in part: still in use
    cache.put(4 * MiB, b"\4" * MiB)
    assert cache.gaps(0, 5 * MiB) == [(0, MiB)]  # least recently used would have been 2, read-ahead not read yet
    cache.put(5 * MiB, b"\5" * MiB)
    assert cache.gaps(0, 6 * MiB) == [(0, MiB), (2 * MiB, 3 * MiB)]  # then least recently used
