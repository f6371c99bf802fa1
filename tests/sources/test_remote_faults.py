"""Faults injected by a proxy in front of nginx: transient ones are retried to the right bytes, permanent ones
are one clean error, and no wrong byte is ever returned."""

from __future__ import annotations

import os

import pytest
from remote_servers import FaultProxy, Nginx

from ckptfs.errors import SourceError
from ckptfs.sources import RemoteOptions, open_source
from ckptfs.sources.remote.cache import BLOCK

MiB = 1 << 20


@pytest.fixture(scope="module")
def blob(nginx: Nginx) -> bytes:
    data = os.urandom(24 * MiB)
    (nginx.root / "blob.bin").write_bytes(data)
    return data


def opened(proxy: FaultProxy, **options: str) -> object:
    return open_source(f"{proxy.url}/blob.bin", RemoteOptions(storage_options=options))


@pytest.mark.parametrize("fault", ["503", "reset", "short", "slow"])
def test_transient_faults_are_retried_to_the_right_bytes(fault_proxy: FaultProxy, blob: bytes, fault: str) -> None:
    fault_proxy.slow_seconds = 1.5
    fault_proxy.faults = [fault, fault]
    source = opened(fault_proxy, timeout="0.5")  # the opening suffix GET meets both faults
    assert source.read(5 * MiB, 100_000) == blob[5 * MiB : 5 * MiB + 100_000]
    fault_proxy.faults = [fault, fault]
    assert source.read(17 * MiB, 3 * MiB) == blob[17 * MiB : 20 * MiB]
    assert [f for _, f in fault_proxy.seen].count(fault) == 4


def test_exhausted_retries_are_an_error_naming_the_url(fault_proxy: FaultProxy, blob: bytes) -> None:
    source = opened(fault_proxy, retries="3")
    fault_proxy.faults = ["503"] * 3
    with pytest.raises(SourceError, match=rf"^{fault_proxy.url}/blob\.bin: HTTP 503 Service Unavailable \(SlowDown\) "
                                          r"\(gave up after 3 attempts\)$"):
        source.read(1 * MiB, 10)
    assert source.read(1 * MiB, 10) == blob[1 * MiB : 1 * MiB + 10]  # the next read tries again


def test_a_server_ignoring_ranges_is_refused_without_downloading_the_object(fault_proxy: FaultProxy,
                                                                            blob: bytes) -> None:
    fault_proxy.faults = ["ignore-range"]
    with pytest.raises(SourceError, match=r"blob\.bin: the server ignores Range requests \(answered 200 with the "
                                          r"whole object, 25165824 bytes, to bytes=-2097152\)"):
        opened(fault_proxy)
    assert fault_proxy.ignored_range_bytes_sent < 8 * MiB  # the connection closed: the kernel's buffers at most
    source = opened(fault_proxy)
    fault_proxy.faults = ["ignore-range"]
    with pytest.raises(SourceError, match=r"the server ignores Range requests"):
        source.read(0, 10)



def test_a_whole_object_no_larger_than_the_suffix_asked_is_taken(fault_proxy: FaultProxy, nginx: Nginx) -> None:
    small = os.urandom(5000)
    (nginx.root / "small.bin").write_bytes(small)
    fault_proxy.faults = ["ignore-range"]
    source = open_source(f"{fault_proxy.url}/small.bin")
    assert (source.size, source.read(0, 5000)) == (5000, small)
    assert len(fault_proxy.seen) == 1  # every byte came with the first answer


def test_a_redirect_is_followed_and_later_requests_go_where_it_led(fault_proxy: FaultProxy, nginx: Nginx,
                                                                   blob: bytes) -> None:
    fault_proxy.faults = ["redirect"]
    mark = nginx.mark()
    source = open_source(f"http://user:pw@127.0.0.1:{fault_proxy.port}/blob.bin")
    assert source.name == f"{fault_proxy.url}/blob.bin"
    assert source.read(3 * MiB, 1000) == blob[3 * MiB : 3 * MiB + 1000]
    assert len(fault_proxy.seen) == 1
    assert [r.range for r in nginx.since(mark)] == ["bytes=-2097152", f"bytes={3 * MiB}-{3 * MiB + BLOCK - 1}"]


def test_random_faults_never_give_a_wrong_byte(fault_proxy: FaultProxy, blob: bytes) -> None:
    import random

    rng = random.Random(13)
    source = opened(fault_proxy, retries="4")
    for _ in range(60):
        fault_proxy.faults = rng.choices(["", "503", "reset", "short"], k=3)  # fewer than the attempts, in a row
        offset = rng.randrange(0, len(blob))
        length = rng.randrange(0, min(len(blob) - offset, 3 * MiB) + 1)
        assert source.read(offset, length) == blob[offset : offset + length]


def test_faults_never_give_a_wrong_byte_in_the_blocks_a_mount_replies_from(fault_proxy: FaultProxy,
                                                                           blob: bytes) -> None:
    import random

    rng = random.Random(25)
    source = open_source(f"{fault_proxy.url}/blob.bin", RemoteOptions(cache_size=32 * MiB,
                                                                      storage_options={"retries": "4"}))
    for _ in range(40):
        fault_proxy.faults = rng.choices(["", "503", "reset", "short"], k=3)
        offset = rng.randrange(0, len(blob))
        length = rng.randrange(1, min(len(blob) - offset, 960 << 10) + 1)
        buffers, leased = source.buffers(offset, length)  # type: ignore[attr-defined]
        sent = b"".join(os.pread(b[0], b[2], b[1]) if isinstance(b, tuple) else b for b in buffers)
        assert sent == blob[offset : offset + length]
        source.release(leased)  # type: ignore[attr-defined]
    source.close()
    source = open_source(f"{fault_proxy.url}/blob.bin", RemoteOptions(storage_options={"retries": "4"}))
    fault_proxy.faults = ["short"] * 4
    with pytest.raises(SourceError, match=r"short body: .*\(gave up after 4 attempts\)$"):
        source.buffers(0, MiB)  # type: ignore[attr-defined]
    assert source._cache._bytes == 0 and source._store.free_bytes() == source._store.capacity
    buffers, leased = source.buffers(0, MiB)  # type: ignore[attr-defined]
    assert b"".join(os.pread(b[0], b[2], b[1]) for b in buffers) == blob[:MiB]
    source.close()
