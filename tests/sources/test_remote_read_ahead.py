"""Tensor-aware read-ahead: a stream stops at its storage's end until it goes on into the next storage."""

from __future__ import annotations

import io
import re

import torch
from remote_servers import Nginx

import ckptfs
from ckptfs.sources import BytesSource, RemoteOptions
from ckptfs.sources.remote.cache import BLOCK, FIRST_WINDOW, MAX_WINDOW, ReadAhead

KiB, MiB = 1 << 10, 1 << 20
SIZE = 1 << 40


def stream(ahead: ReadAhead, start: int, stop: int, step: int = 4 * KiB) -> list[int]:
    """The fetch ends of a reader going from ``start`` to ``stop`` by ``step``, missing where nothing is fetched."""
    ends, fetched = [], start
    for at in range(start, stop, step):
        if at + step > fetched:
            fetched = ahead.fetch_end(max(at, fetched), min(stop, at + step), SIZE)
            ends.append(fetched)
    return ends


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
    ends = stream(ahead, first[0], first[1])
    assert max(ends) == rounded(first[1]) and ends[-1] == rounded(first[1])
    assert max(b - a for a, b in zip(ends, ends[1:])) == MAX_WINDOW + BLOCK  # the window grew as usual inside
    assert ahead.prefetch(first[1] - 4 * KiB, SIZE) is None  # nor in the background past the end
    crossing = stream(ahead, rounded(first[1]), second[0] + 8 * MiB)  # its header, then on into its data
    assert crossing[0] - rounded(first[1]) == MAX_WINDOW + BLOCK  # a multi-storage stream now: its window crosses ends
    assert crossing[0] > second[1]


def test_a_miss_before_a_storage_brings_its_first_window() -> None:
    ahead = ReadAhead()
    data = (10 * MiB + 64, 30 * MiB)
    ahead.set_extents([(0, 10 * MiB), data])
    assert ahead.fetch_end(10 * MiB + 4, 10 * MiB + 40, SIZE) == rounded(data[0] + FIRST_WINDOW)  # the local header
    fetched = rounded(data[0] + FIRST_WINDOW)
    assert ahead.fetch_end(fetched, fetched + 4096, SIZE) == rounded(fetched + 4096 + 2 * FIRST_WINDOW)  # a stream
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
        big, after = ck.tensor(("big",)), ck.tensor(("next",))
        assert big.storage is not None and after.storage is not None
        big_end = big.storage.offset + big.nbytes
        mark = nginx.mark()
        step = 128 * KiB
        data = b"".join(ck.read(big, at, step) for at in range(0, big.nbytes, step))
        assert data == tensors["big"].numpy().tobytes()
        ranges = [tuple(map(int, re.findall(r"\d+", r.range))) for r in nginx.since(mark)]
        assert max(last for _, last in ranges) < rounded(big_end), ranges
        assert len(ranges) <= 12  # still a stream of growing GETs
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
