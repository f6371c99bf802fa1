"""The extent cache and read-ahead of remote sources, without a server."""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from ckptfs.sources.remote.cache import BLOCK, FIRST_WINDOW, MAX_WINDOW, PREFETCH_STEP, ExtentCache, ReadAhead

KiB, MiB = 1 << 10, 1 << 20
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
    assert ahead.fetch_end(0, BLOCK, size) == BLOCK  # a first read is its block only
    windows, fetched = [], BLOCK
    for at in range(BLOCK, 64 * MiB, BLOCK):  # a reader going on: what is fetched ahead of it after each fetch
        if at + BLOCK > fetched:
            fetched = ahead.fetch_end(at, at + BLOCK, size)
        else:
            fetched = (ahead.prefetch(at, at + BLOCK, size) or (0, fetched))[1]
        windows.append(fetched - at - BLOCK)
    assert windows[0] == FIRST_WINDOW
    assert all(w <= max(FIRST_WINDOW, at + BLOCK) for at, w in zip(range(BLOCK, 64 * MiB, BLOCK), windows))
    assert max(windows) == MAX_WINDOW and windows[-1] >= MAX_WINDOW - PREFETCH_STEP  # doubled up to the bound


def test_a_hit_tops_read_ahead_up_to_as_much_as_was_read() -> None:
    ahead, size = ReadAhead(), 100 * MiB
    assert ahead.fetch_end(0, 64 * KiB, size) == BLOCK
    end = ahead.fetch_end(BLOCK, 2 * BLOCK, size)  # a stream now: its window FIRST_WINDOW
    assert end == 2 * BLOCK + FIRST_WINDOW
    assert ahead.prefetch(2 * BLOCK, 3 * BLOCK, size) is None  # 192 KiB read: its window is FIRST_WINDOW still
    assert ahead.prefetch(3 * BLOCK, 4 * BLOCK, size) == (end, 8 * BLOCK)  # 256 KiB read: 256 KiB ahead
    assert ahead.prefetch(4 * BLOCK, 5 * BLOCK, size) is None  # less than half a window more: not yet
    assert ahead.prefetch(5 * BLOCK, 6 * BLOCK, size) == (8 * BLOCK, 12 * BLOCK)
    assert ahead.prefetch(5 * BLOCK, 6 * BLOCK, size) is None  # read twice: no more evidence
    random = ReadAhead()
    block_end = random.fetch_end(10 * MiB, 10 * MiB + 4096, size)
    assert random.prefetch(10 * MiB, block_end, size) is None  # a lone read is no stream


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
                fetch = ahead.prefetch(at, at + MiB, size) or (0, 0)
            for block in range(fetch[0] // BLOCK, fetch[1] // BLOCK):
                fetched[block] = 1
    assert misses <= 8, misses  # in order, with windows doubling to MAX_WINDOW; not one GET a request
