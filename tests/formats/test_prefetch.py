"""Bytes read while opening: served again without a read, and a read that overlaps them fetches only the rest."""

from __future__ import annotations

from counting import CountingSource
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptfs.formats.prefetch import TAIL_BYTES, Prefetch
from ckptfs.sources import BytesSource

DATA = bytes((n * 7919 + n // 251) % 256 for n in range(300_000))


def _counting(size: int, tail_hint: int = 0) -> CountingSource:
    return CountingSource(BytesSource(DATA[:size]), tail_hint=tail_hint)


def test_the_tail_is_read_first_at_least_the_hint() -> None:
    for hint, expected in ((0, TAIL_BYTES), (100_000, 100_000), (10**9, 300_000)):
        source = _counting(300_000, hint)
        opening = Prefetch(source)
        assert source.reads == [(300_000 - expected, expected)]
        assert opening.tail == DATA[300_000 - expected :] and opening.tail_start == 300_000 - expected


def test_a_read_overlapping_the_tail_fetches_only_what_is_missing() -> None:
    source = _counting(300_000)
    opening = Prefetch(source)
    tail_start = 300_000 - TAIL_BYTES
    assert opening.read(tail_start - 1000, 3000) == DATA[tail_start - 1000 : tail_start + 2000]
    assert source.reads[1:] == [(tail_start - 1000, 1000)]
    assert opening.read(0, 10) == DATA[:10]
    assert opening.read(5, 20_000) == DATA[5:20_005]
    assert source.reads[2:] == [(0, 10), (10, 19_995)]
    assert opening.head(20_005) == DATA[:20_005] and len(source.reads) == 4


@settings(max_examples=200, derandomize=True, deadline=None)
@given(st.integers(1, 300_000), st.lists(st.tuples(st.integers(0, 300_000), st.integers(0, 100_000)), max_size=12))
def test_reads_return_the_source_bytes_in_at_most_one_read(size: int, reads: list[tuple[int, int]]) -> None:
    source = _counting(size)
    opening = Prefetch(source)
    for offset, length in reads:
        offset = min(offset, size)
        length = min(length, size - offset)
        covered = opening.covers(offset, length)
        before = len(source.reads)
        assert opening.read(offset, length) == DATA[offset : offset + length]
        assert len(source.reads) - before <= (0 if covered or length == 0 else 1)
        assert opening.covers(offset, length)
