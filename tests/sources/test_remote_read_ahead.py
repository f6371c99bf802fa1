"""Tensor-aware read-ahead: a stream stops at its storage's end until it goes on into the next storage."""

from __future__ import annotations

import io
import re

import pytest
import torch
from remote_servers import Nginx, timed_gets

import ckptfs
from ckptfs.sources import BytesSource, RemoteOptions, open_source
from ckptfs.sources.remote.cache import BLOCK, FIRST_WINDOW, MAX_WINDOW, PART, ReadAhead
from ckptfs.sources.remote.source import RemoteSource

KiB, MiB = 1 << 10, 1 << 20
SIZE = 1 << 40


def stream(ahead: ReadAhead, start: int, stop: int, step: int = 128 * KiB) -> list[tuple[int, int]]:
    """A reader going from ``start`` to ``stop`` by ``step``: a miss where nothing is fetched, else a hit that may
    top read-ahead up; for each fetch, where the read asking for it ended and where the fetch ends."""
    fetches, fetched = [], start
    for at in range(start, stop, step):
        end = min(stop, at + step)
        if end > fetched:
            fetched = ahead.fetch_end(max(at, fetched), end, SIZE)
            fetches.append((end, fetched))
        else:
            more = ahead.prefetch(at, end, SIZE)
            if more is not None:
                assert more[0] == fetched
                fetched = more[1]
                fetches.append((end, fetched))
    return fetches


def rounded(position: int) -> int:
    return -(-position // BLOCK) * BLOCK


class HintedSource(BytesSource):
    extents: list[tuple[int, int]] | None = None

    def set_extents(self, extents: list[tuple[int, int]]) -> None:
        self.extents = extents


def test_an_opened_checkpoint_tells_its_source_where_the_storages_lie() -> None:
    tensors = {"a": torch.arange(1000, dtype=torch.float32), "b": torch.ones(7, dtype=torch.float64)}
    tensors["view"] = tensors["a"][10:20]  # shares a's storage: no extent of its own
    buffer = io.BytesIO()
    torch.save(tensors, buffer)
    source = HintedSource(buffer.getvalue())
    with ckptfs.open(source) as ck:
        a, b = ck.tensor(("a",)).storage, ck.tensor(("b",)).storage
        assert a is not None and b is not None
        assert sorted(source.extents or []) == sorted([(a.offset, a.offset + 4000), (b.offset, b.offset + 56)])
        assert buffer.getvalue()[a.offset : a.offset + 4000] == tensors["a"].numpy().tobytes()


def test_a_stream_stops_at_its_storage_end_until_it_reads_the_next() -> None:
    ahead = ReadAhead()
    first, second, third = (1000, 1000 + 40 * MiB), (40 * MiB + 1100, 44 * MiB + 1100), (44 * MiB + 1200, 99 * MiB)
    ahead.set_extents([third, first, second, (2 * MiB, 3 * MiB)])  # unsorted; an overlapping one is ignored
    fetches = stream(ahead, first[0], first[1])
    assert max(f for _, f in fetches) == rounded(first[1]) and fetches[-1][1] == rounded(first[1])
    assert max(f - r for r, f in fetches) == MAX_WINDOW + BLOCK - 1000  # the window grew as usual inside
    assert all(f - r <= max(FIRST_WINDOW, r - first[0]) + BLOCK for r, f in fetches)  # as far as was read at most
    assert ahead.prefetch(first[1] - 4 * KiB, first[1], SIZE) is None  # nor in the background past the end
    crossing = stream(ahead, rounded(first[1]), second[0] + 8 * MiB)  # its header, then on into its data
    assert crossing[0][1] - crossing[0][0] >= MAX_WINDOW  # a multi-storage stream now: its window crosses ends
    assert crossing[0][1] > second[1]


def test_a_miss_before_a_storage_brings_its_first_window() -> None:
    ahead = ReadAhead()
    data = (10 * MiB + 64, 30 * MiB)
    ahead.set_extents([(0, 10 * MiB), data])
    assert ahead.fetch_end(10 * MiB + 4, 10 * MiB + 40, SIZE) == rounded(data[0] + FIRST_WINDOW)  # the local header
    fetched = rounded(data[0] + FIRST_WINDOW)
    assert ahead.fetch_end(fetched, fetched + 4096, SIZE) == rounded(fetched + 4096 + FIRST_WINDOW)  # a stream
    small = ReadAhead()
    small.set_extents([(1000, 1000 + 300)])
    assert small.fetch_end(960, 990, SIZE) == BLOCK  # a small storage comes whole with its header


def test_without_extents_read_ahead_is_as_before() -> None:
    hinted, plain = ReadAhead(), ReadAhead()
    hinted.set_extents([])
    assert stream(hinted, 0, 100 * MiB) == stream(plain, 0, 100 * MiB)


def test_reading_a_tensor_over_http_never_fetches_past_its_end(nginx: Nginx) -> None:
    generator = torch.Generator().manual_seed(11)
    tensors = {"big": torch.randn(6 << 20, generator=generator), "next": torch.randn(6 << 20, generator=generator),
               "last": torch.randn(3 << 20, generator=generator)}
    torch.save(tensors, nginx.root / "aware.pt")
    with ckptfs.open(f"{nginx.url}/aware.pt") as ck:
        timed_gets(ck.source, 0.0001)  # a fast connection: windows in one GET each up to PART
        big, after = ck.tensor(("big",)), ck.tensor(("next",))
        assert big.storage is not None and after.storage is not None
        big_end = big.storage.offset + big.nbytes
        mark = nginx.mark()
        step = 128 * KiB
        data = b"".join(ck.read(big, at, step) for at in range(0, big.nbytes, step))
        assert data == tensors["big"].numpy().tobytes()
        ranges = [tuple(map(int, re.findall(r"\d+", r.range))) for r in nginx.since(mark)]
        assert max(last for _, last in ranges) < rounded(big_end), ranges
        assert len(ranges) <= 24  # still a stream of growing GETs (each at least half a window)
        mark = nginx.mark()
        data = b"".join(ck.read(after, at, step) for at in range(0, after.nbytes, step))
        assert data == tensors["next"].numpy().tobytes()
        sizes = [r.sent for r in nginx.since(mark)]
        assert sum(sizes) >= MAX_WINDOW and min(sizes) >= MiB, sizes  # going on into the next: large GETs at once


def test_a_tensor_first_read_and_its_local_header_are_one_get(nginx: Nginx) -> None:
    generator = torch.Generator().manual_seed(12)
    tensors = {f"t{i}": torch.randn(1 << 20, generator=generator) for i in range(3)}
    torch.save(tensors, nginx.root / "headers.pt")
    with ckptfs.open(f"{nginx.url}/headers.pt", remote=RemoteOptions(storage_options={"tail_size": "64KiB"})) as ck:
        for name in ("t1", "t2"):  # t0 came with data.pkl, read at open
            mark = nginx.mark()
            assert ck.read(ck.tensor((name,)), 0, 4096) == tensors[name].numpy().tobytes()[:4096]
            assert len(nginx.since(mark)) == 1  # the zip local header, checked first, came with the data


@pytest.fixture(scope="module")
def striped(nginx: Nginx) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(27)
    tensors = {"big": torch.randn(8 << 20, generator=generator), "next": torch.randn(1 << 20, generator=generator)}
    torch.save(tensors, nginx.root / "striped.pt")  # "big": 32 MiB
    return tensors


def asked(source: RemoteSource) -> list[tuple[int, int]]:
    """The ranges the source's GETs ask for from now on, as each GET starts (background ones too)."""
    ranges: list[tuple[int, int]] = []
    get_into = source._getter.get_into  # noqa: SLF001

    def recorded(start: int, view: memoryview) -> None:
        ranges.append((start, start + len(view)))
        get_into(start, view)

    source._getter.get_into = recorded  # type: ignore[method-assign]  # noqa: SLF001
    return ranges


def settled(source: RemoteSource, ranges: list[tuple[int, int]]) -> int:
    """The bytes asked for, once no read-ahead is under way any more."""
    for _, future in list(source._pending.values()):  # noqa: SLF001
        future.exception()
    return sum(last - first for first, last in ranges)


RATES = [0.0001, 0.25, 30.0]
"""Seconds every GET of 1 MiB or more takes to the rate measure (``timed_gets``): a fast connection (~10 GB/s),
one capped at ~34 MB/s, a very slow one (0.3 MB/s): 2, 16 and 16 parts in flight, windows of at most 16, 192 and
192 MiB."""


@pytest.mark.parametrize("seconds", RATES)
def test_read_ahead_grows_with_what_was_read_whatever_the_rate(nginx: Nginx, striped: dict[str, torch.Tensor],
                                                               seconds: float) -> None:
    source = open_source(f"{nginx.url}/striped.pt", RemoteOptions())
    with ckptfs.open(source) as ck:
        big = ck.tensor(("big",))
        assert big.storage is not None
        data = striped["big"].numpy().tobytes()
        timed_gets(source, seconds)
        ranges = asked(source)
        for chunk in (1, 27):  # a zarr slice's two 1 MiB chunks, apart, in the 128 KiB requests of a plain user's mount
            got = b"".join(ck.read(big, chunk * MiB + at, 128 * KiB) for at in range(0, MiB, 128 * KiB))
            assert got == data[chunk * MiB : (chunk + 1) * MiB]
        # Each chunk its MiB and a window of at most as much again; the first also the local header, checked on the
        # tensor's first read, and the storage's first window with it.
        assert settled(source, ranges) <= 2 * (2 * MiB + 2 * BLOCK) + FIRST_WINDOW + 2 * BLOCK, ranges
        ranges.clear()
        read = 0
        for block in range(8, 16):  # Dask-like blocks of 256 rows of 4 KiB, one read each, one after another
            assert ck.read(big, block * MiB, MiB) == data[block * MiB : (block + 1) * MiB]
            read += MiB
            assert settled(source, ranges) <= 2 * read + 2 * BLOCK, (read, ranges)  # at most as much again ahead
        at = 16 * MiB
        while at < big.nbytes:  # on to the tensor's end in 128 KiB reads: as much again ahead at most, all the way
            assert ck.read(big, at, 128 * KiB) == data[at : at + 128 * KiB]
            at += 128 * KiB
            assert settled(source, ranges) <= 2 * (at - 8 * MiB) + 2 * BLOCK, (at, ranges)
        assert settled(source, ranges) <= big.nbytes - 8 * MiB + BLOCK  # each byte once (27's chunk was held)
        assert max(last for _, last in ranges) <= rounded(big.storage.offset + big.nbytes)  # none past its end


def test_a_windows_parts_follow_the_rate_and_its_size_what_was_read() -> None:
    ahead = ReadAhead()
    ahead.parts, ahead.max_window = 16, 192 * MiB  # a slow connection's: 16 parts in flight
    assert ahead.fetch_end(0, MiB, SIZE) == MiB  # a lone read: no window
    end = ahead.fetch_end(MiB, 2 * MiB, SIZE)
    assert end == 4 * MiB and ahead.part == MiB  # 2 MiB read, 2 MiB ahead: parts of a MiB (each measures a rate)
    fetched = ahead.prefetch(3 * MiB, 4 * MiB, SIZE)
    assert fetched == (4 * MiB, 7 * MiB) and ahead.part == MiB  # 3 MiB read: 3 MiB ahead
    for at in range(4 * MiB, 64 * MiB, MiB):
        fetched = ahead.prefetch(at, at + MiB, SIZE) or fetched
    assert fetched[1] <= 64 * MiB + 64 * MiB and 3 * MiB < ahead.part <= 4 * MiB  # a ~64 MiB window: 16 parts
    fast = ReadAhead()
    fast.fetch_end(0, MiB, SIZE)
    assert fast.fetch_end(MiB, 2 * MiB, SIZE) == 4 * MiB and fast.part == PART  # fast: one GET a window up to PART
