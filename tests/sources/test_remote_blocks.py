"""The memfd block store of remote sources and the cache's leases of its blocks, without a server."""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from ckptfs.sources.remote.blocks import GRAIN, POPULATE, BlockStore
from ckptfs.sources.remote.cache import ExtentCache

OBJECT = os.urandom(1 << 22)
SPAN = 1 << 18
"""The bytes the property test puts and reads."""


def _filled(store: BlockStore, start: int, size: int):  # type: ignore[no-untyped-def]
    block = store.take(size)
    block.view[:] = OBJECT[start : start + size]
    return block


def _read_replies(buffers: list[tuple[int, int, int] | bytes]) -> bytes:
    """What libfuse sends for a reply's buffers: an fd range read with pread, bytes as they are."""
    return b"".join(os.pread(b[0], b[2], b[1]) if isinstance(b, tuple) else b for b in buffers)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, SPAN - 1), st.integers(1, 5 * GRAIN)), max_size=40),
       st.integers(1, 12))
def test_blocks_are_reused_only_once_nothing_holds_their_bytes(puts: list[tuple[int, int]], grains: int) -> None:
    store = BlockStore(grains * GRAIN)
    cache = ExtentCache(grains * GRAIN, store)
    for start, length in puts:
        length = min(length, SPAN - start)
        cache.reserve(length)
        cache.put(start, _filled(store, start, length), reserved=True)
        scribble = store.take(GRAIN)  # another fetch writing into a reused block meanwhile
        scribble.view[:] = b"\xff" * GRAIN
        store.give(scribble)
        assert cache._bytes <= cache.capacity
        view = memoryview(bytearray(SPAN))
        cache.copy_into(0, view)
        for first, last in cache.gaps(0, SPAN):
            view[first:last] = OBJECT[first:last]
        assert view == OBJECT[:SPAN]
    held = sum(-(-len(data) // GRAIN) * GRAIN for data in cache._data.values()
               if getattr(data, "offset", -1) >= 0)
    assert store.free_bytes() + held == store.capacity
    store.close()


def test_a_block_a_reply_is_sent_from_is_not_reused_before_the_reply_is_done() -> None:
    store = BlockStore(2 * GRAIN)
    cache = ExtentCache(2 * GRAIN, store)
    cache.put(0, _filled(store, 0, GRAIN))
    buffers, leased = cache.lease(100, 300)  # type: ignore[misc]
    assert buffers == [(store.fileno(), 100, 200)] and len(leased) == 1
    cache.put(GRAIN, _filled(store, GRAIN, GRAIN))
    cache.put(2 * GRAIN, _filled(store, 2 * GRAIN, GRAIN))  # evicts the leased block: the cache forgets it ...
    assert cache.gaps(0, GRAIN) == [(0, GRAIN)]
    fetch = store.take(GRAIN)  # ... but the memfd has no room until the reply is done: private memory
    assert fetch.offset == -1
    fetch.view[:] = b"\0" * GRAIN
    assert _read_replies(buffers) == OBJECT[100:300]
    cache.unlease(leased)
    assert store.take(GRAIN).offset == 0  # now it is reused
    store.close()


def test_a_lease_spans_extents_and_gives_bytes_for_memory_outside_the_memfd() -> None:
    store = BlockStore(4 * GRAIN)
    cache = ExtentCache(8 * GRAIN, store)
    cache.put(0, _filled(store, 0, 2 * GRAIN))
    cache.put(2 * GRAIN, OBJECT[2 * GRAIN : 3 * GRAIN])  # bytes (the opening suffix GET's, say)
    cache.put(3 * GRAIN, _filled(store, 3 * GRAIN, GRAIN))
    assert cache.lease(GRAIN, 5 * GRAIN) is None  # a gap
    buffers, leased = cache.lease(GRAIN, 4 * GRAIN - 10)  # type: ignore[misc]
    assert [type(b) for b in buffers] == [tuple, bytes, tuple] and len(leased) == 2
    assert buffers[0] == (store.fileno(), GRAIN, GRAIN) and buffers[2] == (store.fileno(), 2 * GRAIN, GRAIN - 10)
    assert _read_replies(buffers) == OBJECT[GRAIN : 4 * GRAIN - 10]
    cache.unlease(leased)
    store.close()


def test_freed_runs_join_so_a_large_fetch_finds_room_again() -> None:
    store = BlockStore(8 * GRAIN)
    blocks = [store.take(GRAIN) for _ in range(8)]
    assert [b.offset for b in blocks] == [i * GRAIN for i in range(8)]
    assert store.take(1).offset == -1  # full: private memory
    for index in (1, 3, 2):
        store.give(blocks[index])
    assert store.free_bytes() == 3 * GRAIN
    big = store.take(3 * GRAIN - 5)
    assert (big.offset, len(big)) == (GRAIN, 3 * GRAIN - 5) and store.free_bytes() == 0
    store.give(big)
    store.give(blocks[0])
    store.give(blocks[4])
    assert store.take(5 * GRAIN).offset == 0
    store.close()


def test_a_fetch_reuses_a_block_a_reply_was_sent_from_to_its_end_before_fresh_memory() -> None:
    store = BlockStore(4 * POPULATE)
    cache = ExtentCache(4 * POPULATE, store)
    count = POPULATE // GRAIN
    for index in range(count):  # the pages allocated at once by the first block's ``populate``
        cache.put(index * GRAIN, _filled(store, index * GRAIN, GRAIN))
    assert cache.held(0, GRAIN) == OBJECT[:GRAIN]  # read to its end in process: kept until the cache is full
    assert store.fresh(GRAIN) and not cache.recycle()
    for start, end in ((GRAIN, 2 * GRAIN), (2 * GRAIN, 2 * GRAIN + 10), (3 * GRAIN, 4 * GRAIN)):
        buffers, leased = cache.lease(start, end)  # type: ignore[misc]
        assert _read_replies(buffers) == OBJECT[start:end]
        cache.unlease(leased)
    assert cache.recycle()  # the second: sent to its end before the fourth; the third was sent in part
    assert not store.fresh(GRAIN) and store.take(GRAIN).offset == GRAIN
    assert cache.recycle() and not cache.recycle()
    assert cache.gaps(0, 4 * GRAIN) == [(GRAIN, 2 * GRAIN), (3 * GRAIN, 4 * GRAIN)]
    store.close()


def test_a_block_on_pages_never_written_populates_them_and_those_up_to_the_next_boundary() -> None:
    store = BlockStore(4 * POPULATE)
    first = store.take(GRAIN)
    assert first.fresh is not None and first.fresh[1:] == (0, POPULATE)
    first.populate()
    assert first.fresh is None and store.take(POPULATE - GRAIN).fresh is None  # allocated already
    third = store.take(POPULATE + GRAIN)
    assert third.fresh is not None and third.fresh[1:] == (POPULATE, 3 * POPULATE)
    third.populate()
    third.view[:] = OBJECT[: len(third)]
    assert os.pread(store.fileno(), len(third), POPULATE) == OBJECT[: len(third)]
    store.close()
