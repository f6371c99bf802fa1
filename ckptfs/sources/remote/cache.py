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
from ckptfs.sources.remote.parts import MEASURED, MIN_PARTS

KiB, MiB = 1 << 10, 1 << 20
BLOCK = 64 * KiB
"""Fetches start and end on these boundaries: a page-fault read (4-128 KiB) and its neighbours cost one GET."""
FIRST_WINDOW = 256 * KiB
"""Read-ahead of a stream's second fetch, and its least: small, for latency; it then grows with what the stream's
reader has read (``ReadAhead``)."""
MAX_WINDOW = 16 * MiB
"""The largest read-ahead over fast connections: reading one tensor alone fetches at most its bytes and the
window more (``ReadAhead.max_window``: larger when each connection is slow, ``parts.PartPool.parts``; a window
only ever reaches it once the reader has read as much)."""
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
    """Sequential streams, by where their last fetch ended. How far a stream reads ahead (its window) grows only
    with what its reader has read: the window is the bytes the stream's reads asked for (never more than the span
    they cover: bytes skipped or read twice are no evidence), FIRST_WINDOW at least and ``max_window`` at most, so
    it doubles each time the reader has read as much again. A lone read is no stream and reads nothing ahead. A
    miss continuing a stream fetches up to its window past the read; a hit that leaves less than the window
    ahead, by at least a step (half the window, at most PREFETCH_STEP, at most a part past MAX_WINDOW), tops the
    read-ahead up in the background (``prefetch``).

    The bound, whatever the connections' rate: every fetch ends at most a window past the read that asked for it
    (on the next block boundary), so a reader going through a tensor fetches at most the bytes it read and as
    many again (FIRST_WINDOW at least, ``max_window`` at most), and never past its storage's end (below). The
    rate only says how many parts of a window are fetched at once (``parts``: a range given is fetched in parts
    of ``part`` bytes) and how large a window may get (``max_window``: MAX_WINDOW, or as many PARTs as a stream
    keeps in flight over slow connections and half as many again); it never makes a window larger than what its
    reader has read.

    Tensor-aware when told where the object's storages lie (``set_extents``): a stream's read-ahead stops at the
    end of the storage it reads (a block past it at most) until the stream goes on into another storage; from
    then on it reads the storages in order and its window crosses their ends. A miss before a storage (its
    zip local header, read to check it) fetches the storage's first window with it."""

    def __init__(self, block: int = BLOCK) -> None:
        self.block = block
        self.max_window = MAX_WINDOW
        self.parts = MIN_PARTS
        """Parts of a window a stream fetches at once: set from the connections' rate (``parts.PartPool.parts``)."""
        self.part = PART
        """The size of the parts the range ``fetch_end`` or ``prefetch`` gave last is fetched in."""
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

    def window(self, stream: _Stream) -> int:
        """How far ``stream`` reads ahead: the bytes its reads asked for (never more than the span they cover:
        bytes skipped or read twice are no evidence), FIRST_WINDOW at least, ``max_window`` at most."""
        return min(self.max_window, max(FIRST_WINDOW, min(stream.read, stream.reached - stream.begun)))

    def fetch_end(self, start: int, end: int, size: int, asked: int | None = None) -> int:
        """Where a fetch for a miss at ``[start, end)`` should end: ``end`` and the stream's read-ahead,
        on a block boundary, within the object. ``asked``: where the read began, if before ``start`` (the bytes
        before were held)."""
        asked = start if asked is None else min(asked, start)
        owner = bisect.bisect_right(self._ends, start)
        stream, window, last = _Stream(asked, end, end - asked, owner, False, False), 0, end
        for stream_end, known in self._streams.items():
            if stream_end - STREAM_SLACK <= start <= stream_end + STREAM_SLACK:
                del self._streams[stream_end]
                stream = _Stream(min(asked, known.begun), max(end, known.reached), known.read + end - asked, owner,
                                 known.spans or owner != known.owner, True)
                window = self.window(stream)
                last = max(end, stream_end)  # a miss behind the stream's end (out of order) keeps its end
                break
        fetch_end = self.round(end + window, size)
        if owner < len(self._starts) and not stream.spans:
            first = self._starts[owner]
            if end <= first:  # before the storage: its header; its first window comes along, a stream's
                stream, window = stream._replace(going=True), max(window, FIRST_WINDOW)
                fetch_end = max(fetch_end, self.round(min(self._ends[owner], first + FIRST_WINDOW), size))
            fetch_end = min(fetch_end, max(self.round(end, size), self.round(self._ends[owner], size)))
        self.part = self._part(max(window, end - asked))
        self._streams[max(fetch_end, last)] = stream
        self._streams.move_to_end(max(fetch_end, last))
        while len(self._streams) > MAX_STREAMS:
            self._streams.popitem(last=False)
        return fetch_end

    def prefetch(self, start: int, end: int, size: int) -> tuple[int, int] | None:
        """The range to fetch in the background after a hit at ``[start, end)`` within a stream's fetched bytes:
        from where the stream's fetches end to its window past ``end``, if that is a step or more, never past its
        storage's end unless it spans storages; None if there is none."""
        for stream_end, known in self._streams.items():
            if known.going and known.begun <= start and end <= stream_end:
                stream = known._replace(reached=max(end, known.reached), read=known.read + end - start)
                self._streams[stream_end] = stream
                limit = size
                if not stream.spans and stream.owner < len(self._ends):
                    limit = self.round(self._ends[stream.owner], size)
                window = self.window(stream)
                fetch_end = min(limit, self.round(end + window, size))
                if fetch_end <= stream_end or (fetch_end - stream_end < min(window // 2, self._step(window)) and
                                               fetch_end < limit):
                    return None
                if window > MAX_WINDOW and fetch_end < limit:  # whole parts: each its own GET
                    part = self._part(window)
                    fetch_end = stream_end + (fetch_end - stream_end) // part * part
                del self._streams[stream_end]
                self._streams[fetch_end] = stream
                self.part = self._part(window)
                return stream_end, fetch_end
        return None

    def _part(self, window: int) -> int:
        """The parts a window is fetched in: over slow connections ``parts`` of them, in flight at once, each at
        least a MEASURED GET (it measures its connection's rate too); PARTs otherwise."""
        if self.parts <= MIN_PARTS:
            return PART
        return max(MEASURED, min(PART, window // self.parts // self.block * self.block))

    def _step(self, window: int) -> int:
        return PREFETCH_STEP if window <= MAX_WINDOW else self._part(window)

    def round(self, position: int, size: int) -> int:
        """``position`` rounded up to a block boundary, within the object."""
        return min(size, -(-position // self.block) * self.block)


class _Stream(NamedTuple):
    begun: int
    """Where its first read began."""
    reached: int
    """The furthest its reads went."""
    read: int
    """The bytes its reads asked for."""
    owner: int
    """The storage its last miss was in or before (an index into the extents; past them if none)."""
    spans: bool
    """Whether it went on from one storage into another: its read-ahead then crosses storages' ends."""
    going: bool
    """Whether a read went on where its first ended (or the first read a storage's header, its data follows): a
    lone read is no stream, and reads nothing ahead."""
