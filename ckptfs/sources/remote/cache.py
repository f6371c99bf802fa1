"""A bounded in-memory cache of fetched byte ranges, and the sequential read-ahead that sizes fetches.

The cache holds extents (one per GET, never overlapping), evicted least recently used first; pinned
extents (the opening suffix GET) stay. Fetches go into blocks of a memfd (``blocks.BlockStore``) that a mount
replies from by file descriptor (``lease``); the store takes them back when the cache evicts them. Not
thread-safe: the source holds a lock around both.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from typing import NamedTuple

from ckptfs.sources.remote.blocks import Block, BlockStore

KiB, MiB = 1 << 10, 1 << 20
BLOCK = 64 * KiB
"""Fetches start and end on these boundaries: a page-fault read (4-128 KiB) and its neighbours cost one GET."""
FIRST_WINDOW = 256 * KiB
"""Read-ahead of a stream's second fetch: small, for latency; it doubles with every fetch after."""
MAX_WINDOW = 16 * MiB
"""The largest read-ahead over fast connections: reading one tensor alone fetches at most its bytes and the
window more (``ReadAhead.max_window``: larger when each connection is slow, ``parts.PartPool.parts``)."""
STREAM_SLACK = 2 * MiB
"""A miss this far before or after where a stream's last fetch ended continues the stream: the kernel's
read-ahead sends requests of up to 1 MiB that may come out of order (the second MiB asked before the first)."""
PREFETCH_STEP = 4 * MiB
"""A stream at its largest window keeps MAX_WINDOW fetched or in flight ahead of its reader, topped up in parts of
at least this much as the reader advances: several GETs at once, each on its own connection."""
PART = 8 * MiB
"""A GET's largest part, and a window larger than MAX_WINDOW's top-up step: object stores serve ~50-100 MB/s a
connection, 20-50 ms to the first byte, so a part of 8 MiB spends ~5% of its time waiting for it."""
MAX_STREAMS = 16


FdRange = tuple[int, int, int]
"""``(fd, pos, size)``: bytes a reply reads from a file descriptor (the store's memfd)."""
Held = bytes | bytearray | memoryview | Block


class ExtentCache:
    def __init__(self, capacity: int, store: BlockStore | None = None) -> None:
        self.capacity = capacity
        self.store = store
        self._starts: list[int] = []
        self._data: dict[int, Held] = {}
        """Each extent's bytes, never changed once held; a Block is the store's, given back when evicted."""
        self._recent: OrderedDict[int, None] = OrderedDict()
        """Unpinned extents, least recently used first."""
        self._done: OrderedDict[int, None] = OrderedDict()
        self._sent: OrderedDict[int, None] = OrderedDict()
        """Extents replies were sent from to their end (``lease``), least recently first: the kernel's page cache
        holds their bytes now."""
        self._bytes = 0

    def gaps(self, start: int, end: int) -> list[tuple[int, int]]:
        """The sub-ranges of ``[start, end)`` no extent holds."""
        gaps = []
        index = max(0, bisect.bisect_right(self._starts, start) - 1)
        position = start
        while position < end and index < len(self._starts):
            extent_start = self._starts[index]
            extent_end = extent_start + len(self._data[extent_start])
            if extent_start >= end:
                break
            if extent_start > position:
                gaps.append((position, extent_start))
            position = max(position, extent_end)
            index += 1
        if position < end:
            gaps.append((position, end))
        return gaps

    def held(self, start: int, end: int) -> bytes | None:
        """``[start, end)`` when one extent holds all of it (the common hit: a read within one fetch)."""
        index = bisect.bisect_right(self._starts, start) - 1
        if index < 0:
            return None
        extent_start = self._starts[index]
        data = self._data[extent_start]
        if end > extent_start + len(data):
            return None
        self._touch(extent_start, end == extent_start + len(data))
        return bytes(_view(data)[start - extent_start : end - extent_start])

    def copy_into(self, start: int, view: memoryview) -> None:
        """Copies into ``view`` the bytes from ``start`` that extents hold (the gaps' bytes are left as they are)."""
        end = start + len(view)
        index = max(0, bisect.bisect_right(self._starts, start) - 1)
        while index < len(self._starts) and self._starts[index] < end:
            extent_start = self._starts[index]
            data = self._data[extent_start]
            first, last = max(start, extent_start), min(end, extent_start + len(data))
            if first < last:
                view[first - start : last - start] = _view(data)[first - extent_start : last - extent_start]
                self._touch(extent_start, last == extent_start + len(data))
            index += 1

    def lease(self, start: int, end: int) -> tuple[list[FdRange | bytes], list[Block]] | None:
        """``[start, end)`` as a reply's buffers when extents hold all of it: ranges of the store's memfd (each
        block leased: not reused until ``unlease``), bytes for what other memory holds; None on a gap."""
        if self.gaps(start, end):
            return None
        buffers: list[FdRange | bytes] = []
        leased: list[Block] = []
        index = bisect.bisect_right(self._starts, start) - 1
        position = start
        while position < end:
            extent_start = self._starts[index]
            data = self._data[extent_start]
            last = min(end, extent_start + len(data))
            if last > position:
                self._touch(extent_start, last == extent_start + len(data))
                if last == extent_start + len(data) and extent_start in self._recent:
                    self._sent[extent_start] = None
                if isinstance(data, Block) and data.offset >= 0 and self.store is not None:
                    self.store.lease(data)
                    leased.append(data)
                    buffers.append((self.store.fileno(), data.offset + position - extent_start, last - position))
                else:
                    buffers.append(bytes(_view(data)[position - extent_start : last - extent_start]))
                position = last
            index += 1
        return buffers, leased

    def unlease(self, leased: list[Block]) -> None:
        """The reply sent from these blocks (``lease``) is done."""
        assert self.store is not None or not leased
        for block in leased:
            self.store.release(block)  # type: ignore[union-attr]

    def drop_blocks(self) -> None:
        """Forgets the extents the store holds, and the store's bytes (a forked process: its memfd is the
        parent's too). Counts only what is left: fetches under way in the parent are not this process's."""
        for start in [s for s, data in self._data.items() if isinstance(data, Block)]:
            self._recent.pop(start, None)
            self._done.pop(start, None)
            self._sent.pop(start, None)
            del self._data[start]
            del self._starts[bisect.bisect_left(self._starts, start)]
        self._bytes = sum(len(self._data[start]) for start in self._recent)

    def _touch(self, start: int, to_its_end: bool) -> None:
        """A read of the extent at ``start``: the most recently used; read to its end (a stream has gone past it),
        among those evicted first, before the read-ahead not read yet (``_done``, least recently read first)."""
        if start in self._recent:
            self._recent.move_to_end(start)
            if to_its_end:
                self._done[start] = None
                self._done.move_to_end(start)
            else:
                self._done.pop(start, None)

    def reserve(self, size: int) -> None:
        """Counts a fetch of ``size`` bytes under way in the cache's bytes (least recently used extents evicted to
        make room), until it is ``put`` (``reserved``) or ``release``d."""
        self._bytes += size
        self._evict_over()

    def release(self, size: int) -> None:
        self._bytes -= size

    def put(self, start: int, data: Held, pinned: bool = False, reserved: bool = False, read: bool = False) -> None:
        """Holds ``data``'s bytes that no extent holds yet (another thread may have fetched some); evicts the least
        recently used extents that no longer fit. A Block is the store's (``BlockStore.take``): the cache owns it
        from now on. ``reserved``: its bytes were counted by ``reserve``; ``read``: a read took them to their end
        (``_touch``)."""
        if reserved:
            self._bytes -= len(data)
        gaps = self.gaps(start, start + len(data))
        whole = gaps == [(start, start + len(data))]
        for first, last in gaps:
            part = data if whole else bytes(_view(data)[first - start : last - start])
            bisect.insort(self._starts, first)
            self._data[first] = part
            if not pinned:
                self._recent[first] = None
                self._bytes += len(part)
                if read:
                    self._done[first] = None
        if isinstance(data, Block) and not whole and self.store is not None:
            self.store.give(data)  # the parts not held yet were copied
        self._evict_over()

    def recycle(self) -> bool:
        """Evicts the extent a reply was sent from to its end longest ago, if any, so that a fetch reuses its block
        rather than fresh memory (``BlockStore.fresh``): through a mount, the kernel's page cache holds those bytes,
        and a sequential read never fills the cache. Extents ``read`` returned stay until the cache is full."""
        if not self._sent:
            return False
        self._evict(next(iter(self._sent)))
        return True

    def _evict_over(self) -> None:
        while self._bytes > self.capacity and self._recent:
            self._evict(next(iter(self._done or self._recent)))

    def _evict(self, start: int) -> None:
        del self._recent[start]
        self._done.pop(start, None)
        self._sent.pop(start, None)
        data = self._data.pop(start)
        self._bytes -= len(data)
        del self._starts[bisect.bisect_left(self._starts, start)]
        if isinstance(data, Block) and self.store is not None:
            self.store.give(data)


def _view(data: Held) -> memoryview:
    return data.view if isinstance(data, Block) else memoryview(data)


class ReadAhead:
    """Sequential streams, by where their last fetch ended: a miss continuing one doubles its window, and a hit
    past the middle of its last window asks for the next one ahead of time (``prefetch``); at MAX_WINDOW, a hit
    that leaves less than MAX_WINDOW - PREFETCH_STEP ahead tops the read-ahead up to MAX_WINDOW again. The largest
    window is ``max_window``: MAX_WINDOW, or as many PARTs as a stream keeps in flight over slow connections,
    topped up a PART at a time.

    Tensor-aware when told where the object's storages lie (``set_extents``): a stream's read-ahead stops at the
    end of the storage it reads (a block past it at most) until the stream goes on into another storage; from
    then on it reads the storages in order and its window crosses their ends. A miss before a storage (its
    zip local header, read to check it) fetches the storage's first window with it."""

    def __init__(self, block: int = BLOCK) -> None:
        self.block = block
        self.max_window = MAX_WINDOW
        self._streams: OrderedDict[int, _Stream] = OrderedDict()
        """Where each stream's last fetch ended -> the stream, least recently used first."""
        self._starts: list[int] = []
        self._ends: list[int] = []

    def set_extents(self, extents: list[tuple[int, int]]) -> None:
        """Where the storages lie: ``(start, end)`` byte ranges; overlapping or empty ones are ignored."""
        starts, ends = [], []
        for start, end in sorted(extents):
            if start < end and (not ends or start >= ends[-1]):
                starts.append(start)
                ends.append(end)
        self._starts, self._ends = starts, ends

    def fetch_end(self, start: int, end: int, size: int) -> int:
        """Where a fetch for a miss at ``[start, end)`` should end: ``end`` and the stream's read-ahead,
        on a block boundary, within the object."""
        owner = bisect.bisect_right(self._ends, start)
        stream = _Stream(0, owner, False)
        ahead_of = end
        for stream_end, known in self._streams.items():
            if stream_end - STREAM_SLACK <= start <= stream_end + STREAM_SLACK:
                del self._streams[stream_end]
                stream = _Stream(max(FIRST_WINDOW, self._grown(known.window)), owner,
                                 known.spans or owner != known.owner)
                ahead_of = max(end, stream_end)  # a miss behind the stream's end (out of order) extends it too
                break
        fetch_end = self.round(min(ahead_of + stream.window, end + self.max_window), size)
        if owner < len(self._starts) and not stream.spans:
            first = self._starts[owner]
            if end <= first:  # before the storage: its header; its first window comes along
                stream = stream._replace(window=max(stream.window, FIRST_WINDOW))
                fetch_end = max(fetch_end, self.round(min(self._ends[owner], first + FIRST_WINDOW), size))
            fetch_end = min(fetch_end, max(self.round(end, size), self.round(self._ends[owner], size)))
        self._streams[fetch_end] = stream
        self._streams.move_to_end(fetch_end)
        while len(self._streams) > MAX_STREAMS:
            self._streams.popitem(last=False)
        return fetch_end

    def prefetch(self, end: int, size: int) -> tuple[int, int] | None:
        """The range to fetch in the background after a hit ending at ``end``: the next, doubled, window of the
        sequential stream whose last window ``end`` is past the middle of (or, at MAX_WINDOW, PREFETCH_STEP
        into), never more than ``max_window`` past ``end`` nor past its storage's end unless it spans storages; None
        if there is none."""
        for stream_end, stream in self._streams.items():
            window = stream.window
            if window and stream_end - window <= end <= stream_end and \
                    stream_end - end <= window - min(window // 2, self._step(window)):
                limit = size
                if not stream.spans and stream.owner < len(self._ends):
                    limit = self.round(self._ends[stream.owner], size)
                if stream_end >= limit:
                    return None
                del self._streams[stream_end]
                window = self._grown(window)
                fetch_end = min(limit, stream_end + window, self.round(end + self.max_window, size))
                if window > MAX_WINDOW and fetch_end < limit:  # whole parts: each its own GET
                    fetch_end = stream_end + (fetch_end - stream_end) // PART * PART
                self._streams[fetch_end] = stream._replace(window=window)
                return (stream_end, fetch_end) if fetch_end > stream_end else None
        return None

    def _grown(self, window: int) -> int:
        """A stream's next window: doubled up to MAX_WINDOW; over slow connections (``max_window`` larger) then at
        once ``max_window``, each further doubling costing a GET's time (0.2 s for 8 MiB at 40 MB/s). Not sooner:
        reads of a few MiB (a zarr chunk's rows, a Dask block) stay within the doubling windows whatever the rate."""
        if self.max_window > MAX_WINDOW and window >= MAX_WINDOW:
            return self.max_window
        return min(self.max_window, window * 2)

    @staticmethod
    def _step(window: int) -> int:
        return PREFETCH_STEP if window <= MAX_WINDOW else PART

    def round(self, position: int, size: int) -> int:
        """``position`` rounded up to a block boundary, within the object."""
        return min(size, -(-position // self.block) * self.block)


class _Stream(NamedTuple):
    window: int
    owner: int
    """The storage its last miss was in or before (an index into the extents; past them if none)."""
    spans: bool
    """Whether it went on from one storage into another: its read-ahead then crosses storages' ends."""
