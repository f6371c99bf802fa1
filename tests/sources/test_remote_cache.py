"""The extent cache and read-ahead of remote sources, without a server."""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from ckptfs.sources.remote.cache import BLOCK, FIRST_WINDOW, MAX_WINDOW, ExtentCache, ReadAhead

MiB = 1 << 20
OBJECT = os.urandom(1 << 16)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(OBJECT)), st.integers(0, 9000)), max_size=30),
       st.integers(1, 40000), st.tuples(st.integers(0, len(OBJECT)), st.integers(0, 9000)))
def test_held_bytes_are_the_objects_whatever_the_overlaps(puts: list[tuple[int, int]], capacity: int,
                                                          read: tuple[int, int]) -> None:
    cache = ExtentCache(capacity)
    cache.put(len(OBJECT) - 100, OBJECT[-100:], pinned=True)
    for start, length in puts:
        cache.put(start, OBJECT[start : start + length])
        assert cache._bytes <= capacity  # noqa: SLF001
    start, length = read
    end = min(len(OBJECT), start + length)
    view = memoryview(bytearray(max(0, end - start)))
    cache.copy_into(start, view)
    covered = bytearray(view)
    for first, last in cache.gaps(start, end):
        covered[first - start : last - start] = OBJECT[first:last]
    assert bytes(covered) == OBJECT[start:end]
    held = cache.held(start, end)
    assert held is None or held == OBJECT[start:end]
    assert cache.held(len(OBJECT) - 50, len(OBJECT)) == OBJECT[-50:]  # pinned: never evicted


def test_a_sequential_stream_doubles_its_window_up_to_the_bound() -> None:
    ahead, size = ReadAhead(), 1 << 40
    end = ahead.fetch_end(0, 4096, size)
    assert end == BLOCK  # a first read is its block only
    windows = []
    for _ in range(12):
        new_end = ahead.fetch_end(end, end + 4096, size)
        windows.append(new_end - end)
        end = new_end
    assert windows[0] == FIRST_WINDOW + BLOCK
    assert windows[-1] == MAX_WINDOW + BLOCK and max(windows) <= MAX_WINDOW + BLOCK


def test_a_hit_past_the_middle_of_a_window_prefetches_the_next() -> None:
    ahead, size = ReadAhead(), 100 * MiB
    end = ahead.fetch_end(0, 4096, size)
    end = ahead.fetch_end(end, end + 4096, size)  # a stream now, its window FIRST_WINDOW
    assert ahead.prefetch(end - FIRST_WINDOW + 4096, size) is None  # not past the middle yet
    assert ahead.prefetch(end - 4096, size) == (end, end + 2 * FIRST_WINDOW)
    assert ahead.prefetch(end - 4096, size) is None  # asked once
    random = ReadAhead()
    block_end = random.fetch_end(10 * MiB, 10 * MiB + 4096, size)
    assert random.prefetch(block_end, size) is None  # a lone read is no stream


def test_a_stream_read_out_of_order_still_reads_ahead() -> None:
    """The kernel's read-ahead sends 1 MiB requests that may come out of order: each pair's second MiB first."""
    ahead, size = ReadAhead(), 1 << 40
    fetched = bytearray(64 * MiB // BLOCK + 1024)  # one flag a block
    misses = 0
    for pair in range(0, 64 * MiB, 2 * MiB):
        for at in (pair + MiB, pair):
            blocks = range(at // BLOCK, (at + MiB) // BLOCK)
            missing = [b for b in blocks if not fetched[b]]
            if missing:
                misses += 1
                fetch = (missing[0] * BLOCK, ahead.fetch_end(missing[0] * BLOCK, at + MiB, size))
            else:
                fetch = ahead.prefetch(at + MiB, size) or (0, 0)
            for block in range(fetch[0] // BLOCK, fetch[1] // BLOCK):
                fetched[block] = 1
    assert misses <= 8, misses  # in order, with windows doubling to MAX_WINDOW; not one GET a request
