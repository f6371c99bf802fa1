"""``RemoteSource``: an object read by ranged GETs, through a bounded cache with sequential read-ahead.

Opening costs one request, the suffix GET, whose bytes stay cached: a zip's end records and central directory
are read from them without another request. A read the cache misses fetches from its first missing block to
where read-ahead says (``cache.ReadAhead``), only the gaps; large fetches go in parallel parts of at most
``cache.PART``, and a read larger than a quarter of the cache goes straight into its result, uncached. A
sequential stream's read-ahead is fetched in the background while the reader consumes what came before, in
parts on their own connections (``parts.PartPool``, at most ``max_connections``). How far it runs grows only with
what the reader has read (``cache.ReadAhead``); the connections' measured rate says how many parts of it are
fetched at once (``PartPool.parts``) and lets it grow, over slow connections, to half as many PARTs again, at most
three quarters of the cache (``_window``), fetches under way counted in it. A read needing bytes of a background
fetch waits for it rather than fetching them twice. Fetches go into blocks of a memfd, reused once evicted, that a
mount replies from by file descriptor (``blocks``, ``buffers``). Told where the checkpoint's storages lie
(``set_extents``), read-ahead stops at a storage's end until the reader goes on into the next
(``cache.ReadAhead``). With a disk cache (``disk_cache``), fetches are whole 1 MiB blocks, read from disk when a
checked copy is there.
"""

from __future__ import annotations

import functools
import logging
import threading
from concurrent.futures import Future
from typing import Callable, TypeVar

from ckptfs.errors import SourceError
from ckptfs.sources.base import SourceStat
from ckptfs.sources.remote.blocks import Block, BlockStore
from ckptfs.sources.remote.cache import BLOCK, MAX_WINDOW, PART, ExtentCache, FdRange, ReadAhead
from ckptfs.sources.remote.disk_cache import UNIT, DiskBlocks, DiskCacheSetting, object_identity
from ckptfs.sources.remote.options import DEFAULT_MAX_CONNECTIONS
from ckptfs.sources.remote.parts import MIN_PARTS, PartPool
from ckptfs.sources.remote.ranged_get import ObjectVersion, RangedGetter

log = logging.getLogger("ckptfs.sources.remote")

_Held = TypeVar("_Held")


class RemoteSource:
    def __init__(self, getter: RangedGetter, cache_size: int, tail_size: int,
                 disk_cache: DiskCacheSetting | None = None, pinned: ObjectVersion | None = None,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS) -> None:
        """``pinned``: the version an earlier open pinned (``pinned``): opened without a request, read at it.
        ``max_connections``: GETs in flight at once, besides the reading threads' own."""
        self._getter = getter
        self.name = getter.endpoint.name
        self._parts = PartPool(getter, max_connections)
        if pinned is None:
            began = self._parts.clock()
            tail = getter.get_tail(tail_size)
            self._parts.measured(len(tail), began)  # a slow connection's streams start with many parts
        else:
            getter.version, tail = pinned, b""
        assert getter.version is not None
        self.size = getter.version.size
        self._mtime_ns = getter.version.mtime_ns or 0
        self._lock = threading.Lock()
        self._store = BlockStore(cache_size)
        self._cache = ExtentCache(cache_size, self._store)
        if tail:
            self._cache.put(self.size - len(tail), tail, pinned=True)
        self.tail_hint = len(tail) or min(tail_size, self.size)
        """Opening a checkpoint reads this tail first: the suffix request above holds it (``sources.base``); opened
        pinned, one GET of it."""
        self._disk = self._disk_blocks(disk_cache)
        self._ahead = ReadAhead(BLOCK if self._disk is None else UNIT)
        self._pending: dict[int, tuple[int, Future[None]]] = {}
        """Background fetches under way: start -> (end, its future)."""

    def read(self, offset: int, length: int) -> bytes:
        self._check(offset, length)
        end = offset + length
        data = self._hit(self._cache.held, offset, end)
        if data is not None:
            return data
        result = bytearray(length)
        self._miss(offset, end, memoryview(result))
        return bytes(result)

    def buffers(self, offset: int, length: int) -> tuple[list[FdRange | bytes], list[Block]]:
        """``[offset, offset + length)`` as a reply's buffers (``sources.base.BUFFERS``): ranges of the memfd the
        cache's blocks are in, which stay as they are until ``release(leased)``; bytes where no block holds them
        (a read larger than the cache holds, the opening suffix GET's)."""
        self._check(offset, length)
        end = offset + length
        leased = self._hit(self._cache.lease, offset, end)
        if leased is not None:
            return leased
        if length > self._cache.capacity // 4:
            return [self.read(offset, length)], []
        self._miss(offset, end, None)
        with self._lock:
            leased = self._cache.lease(offset, end)
        return leased if leased is not None else ([self.read(offset, length)], [])  # evicted since (a tiny cache)

    def holds(self, offset: int, length: int) -> bool:
        """Whether the cache holds all of ``[offset, offset + length)``: a read of it waits on no fetch
        (``fuse.opened.HOLDS``)."""
        with self._lock:
            return not self._cache.gaps(offset, offset + length)

    def release(self, leased: list[Block]) -> None:
        """A reply from ``buffers`` is sent: its blocks may be reused."""
        if leased:
            with self._lock:
                self._cache.unlease(leased)

    def _hit(self, take: Callable[[int, int], _Held | None], offset: int, end: int) -> _Held | None:
        """What ``take`` (``held`` or ``lease``) finds of ``[offset, end)`` in the cache, its read-ahead started; None
        on a miss. Either way the parts a stream keeps in flight and its largest window follow the connections' rate."""
        with self._lock:
            self._ahead.parts = parts = self._parts.parts()
            self._ahead.max_window = self._window(parts)
            found = take(offset, end)
            if found is not None:
                self._start_prefetch(self._ahead.prefetch(offset, end, self.size))
            return found

    def _check(self, offset: int, length: int) -> None:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise SourceError(f"read of {length} bytes at offset {offset} is outside the object "
                              f"({self.size} bytes)", self.name)

    def _miss(self, offset: int, end: int, view: memoryview | None) -> None:
        """Fetches what the cache lacks of ``[offset, end)`` and its read-ahead; copies ``[offset, end)`` into
        ``view`` (None: the bytes are left in the cache)."""
        large = view is not None and end - offset > self._cache.capacity // 4
        while True:  # fetches of these bytes under way (read-ahead, or another thread's read) are waited for
            with self._lock:
                waiting = [f for start, (stop, f) in self._pending.items() if start < end and offset < stop]
                if not waiting:
                    gaps, part = self._plan(offset, end, view, large)
                    mine = [] if large else self._claim(gaps)
                    break
            for future in waiting:
                future.exception()  # its failure is not this read's: the gaps it leaves are fetched below
        if not gaps:
            return
        try:
            self._fetch_gaps(offset, end, view, gaps, part, large)
        finally:
            with self._lock:
                for start, future in mine:
                    del self._pending[start]
                    future.set_result(None)

    def _plan(self, offset: int, end: int, view: memoryview | None, large: bool) -> tuple[list[tuple[int, int]], int]:
        """Under the lock: what to fetch for a read of ``[offset, end)`` that no fetch under way holds, and the size
        of its parts (``view`` gets the bytes held already)."""
        if view is not None:
            self._cache.copy_into(offset, view)
        gaps = self._cache.gaps(offset, end)
        if gaps and not large:
            fetch_start = gaps[0][0] // self._ahead.block * self._ahead.block
            fetch_end = self._ahead.fetch_end(gaps[0][0], end, self.size, offset)
            now = fetch_end
            if fetch_end > end + MAX_WINDOW:  # a window of many parts: the reader waits for its first ones only
                now = self._ahead.round(max(end, fetch_start + MAX_WINDOW), self.size)
                now = fetch_end if fetch_end - now < PART else now  # no small straggler
            if now < fetch_end:
                self._start_prefetch((now, fetch_end))
            return self._cache.gaps(fetch_start, now), self._ahead.part
        if not gaps:  # all read ahead (fetches waited for): a hit
            self._start_prefetch(self._ahead.prefetch(offset, end, self.size))
        return gaps, PART

    def _claim(self, gaps: list[tuple[int, int]]) -> list[tuple[int, Future[None]]]:
        """Under the lock: ``gaps`` marked as under way (another thread's read of them waits), where no fetch is."""
        mine: list[tuple[int, Future[None]]] = []
        for start, stop in gaps:
            if not any(s < stop and start < e for s, (e, _) in self._pending.items()):
                future: Future[None] = Future()
                self._pending[start] = (stop, future)
                mine.append((start, future))
        return mine

    def _fetch_gaps(self, offset: int, end: int, view: memoryview | None, gaps: list[tuple[int, int]], part: int,
                    large: bool) -> None:
        if large:
            assert view is not None
            for start, stop in gaps:
                self._fetch_into(start, view[start - offset : stop - offset], part)
            return
        fetched: list[tuple[int, Block]] = []
        try:
            for start, stop in gaps:
                block = self._buffer(stop - start)
                fetched.append((start, block))
                self._fetch_into(start, block.view, part)
                first, last = max(start, offset), min(stop, end)
                if first < last and view is not None:
                    view[first - offset : last - offset] = block.view[first - start : last - start]
        except BaseException:
            with self._lock:
                self._cache.release(sum(len(block) for _, block in fetched))
                for _, block in fetched:
                    self._store.give(block)
            raise
        with self._lock:
            for start, block in fetched:
                self._cache.put(start, block, reserved=True, read=start + len(block) <= end)

    def _window(self, parts: int) -> int:
        """A stream's largest window when it keeps ``parts`` in flight: MAX_WINDOW over fast connections; over slow
        ones half as many PARTs again (parts arrive out of order: those arrived but not yet read count in the
        window, and the pool's threads bound those in flight), at most three quarters of the cache. A stream's
        window reaches it only once its reader has read as much (``cache.ReadAhead``)."""
        if parts <= MIN_PARTS:
            return MAX_WINDOW
        return max(MAX_WINDOW, min(parts * PART * 3 // 2, self._cache.capacity * 3 // 4) // PART * PART)

    def _start_prefetch(self, wanted: tuple[int, int] | None) -> None:
        """Under the lock: fetches the gaps of ``wanted`` in the background, in parts of at most PART."""
        if wanted is None:
            return
        part = self._ahead.part
        for first, last in self._cache.gaps(*wanted):
            for start, stop in _parts(first, last - first, self._ahead.block, part):
                if any(s < stop and start < e for s, (e, _) in self._pending.items()):
                    continue
                task = functools.partial(self._prefetch, start, stop, part)
                self._pending[start] = (stop, self._parts.submit(task, urgent=False))

    def _prefetch(self, start: int, stop: int, part: int) -> None:
        try:
            block = self._buffer(stop - start)
            try:
                self._fetch_into(start, block.view, part)
            except BaseException:
                with self._lock:
                    self._cache.release(len(block))
                    self._store.give(block)
                raise
            with self._lock:
                self._cache.put(start, block, reserved=True)
        except Exception as exc:  # a reader that needs these bytes fetches them itself, and reports its error
            log.info("%s: read-ahead of %d bytes at offset %d: %s", self.name, stop - start, start, exc)
        finally:
            with self._lock:
                del self._pending[start]

    def _buffer(self, size: int) -> Block:
        """A block to fetch ``size`` bytes into, counted in the cache's bytes from now on (``--cache-size`` bounds
        fetches under way too); the cache owns it once put in it (``reserved``), else ``release`` its bytes and
        give it back to the store."""
        with self._lock:
            self._cache.reserve(size)
            while self._store.fresh(size) and self._cache.recycle():
                pass
            block = self._store.take(size)
        block.populate()
        return block

    def set_extents(self, extents: list[tuple[int, int]]) -> None:
        """Where the object's storages lie, for tensor-aware read-ahead (``sources.base.hint_extents``)."""
        with self._lock:
            self._ahead.set_extents(extents)

    def _disk_blocks(self, setting: DiskCacheSetting | None) -> DiskBlocks | None:
        if setting is None:
            return None
        identity = self.identity
        if identity is None:
            log.info("%s: not cached on disk: its answers carry no strong ETag nor version id", self.name)
            return None
        return DiskBlocks(setting, identity, self.size)

    def _fetch_into(self, start: int, view: memoryview, part: int = PART) -> None:
        """The object's bytes from ``start``: the disk cache's blocks, GETs for the rest. A GET covers whole
        blocks (one starting or ending next to bytes held in memory is widened) so that the disk keeps them."""
        disk = self._disk
        if disk is None:
            self._get_into(start, view, part)
            return
        end = start + len(view)
        position = start
        runs = []
        for index in range(start // UNIT, -(-end // UNIT)):
            unit_start, unit_end = disk.unit_range(index)
            data = disk.load(index)
            if data is not None:
                first, last = max(start, unit_start), min(end, unit_end)
                view[first - start : last - start] = memoryview(data)[first - unit_start : last - unit_start]
                if first > position:
                    runs.append((position, first))
                position = last
        if position < end:
            runs.append((position, end))
        for first, last in runs:
            whole_start, whole_end = first // UNIT * UNIT, min(self.size, -(-last // UNIT) * UNIT)
            if (whole_start, whole_end) == (first, last):
                whole = view[first - start : last - start]
                self._get_into(first, whole, part)
            else:
                whole = memoryview(bytearray(whole_end - whole_start))
                self._get_into(whole_start, whole, part)
                view[first - start : last - start] = whole[first - whole_start : last - whole_start]
            for index in range(whole_start // UNIT, -(-whole_end // UNIT)):
                unit_start, unit_end = disk.unit_range(index)
                disk.store(index, whole[unit_start - whole_start : unit_end - whole_start])

    def _get_into(self, start: int, view: memoryview, part: int = PART) -> None:
        """One GET on this thread, or parts of at most ``part`` bytes fetched at once on the pool's connections."""
        if len(view) <= part or self._parts.on_own_thread():  # a read-ahead part (which is never larger)
            for first, last in _parts(start, len(view), BLOCK, part):
                self._parts.fetch(first, view[first - start : last - start])
            return
        futures = [self._parts.submit(functools.partial(self._parts.fetch, first, view[first - start : last - start]),
                                     urgent=True)
                   for first, last in _parts(start, len(view), BLOCK, part)]
        try:
            for future in futures:
                future.result()
        finally:
            for future in futures:  # on a failure, the others are not left writing into ``view``
                if not future.cancel():
                    future.exception()

    @property
    def pinned(self) -> tuple[int, str | None, str | None, int | None]:
        """The version every read asks for: size, ETag, version id, Last-Modified (``RemoteOptions.pinned``)."""
        version = self._getter.version
        assert version is not None
        return tuple(version)  # type: ignore[return-value]

    @property
    def identity(self) -> str | None:
        """What names the version pinned at open (endpoint, public URL, size, ETag, version id, Last-Modified),
        never a credential; None when its answers cannot tell versions apart (no strong ETag nor version id)."""
        version = self._getter.version
        assert version is not None
        endpoint = self._getter.endpoint
        identity = object_identity(self.name, version.size, version.etag, version.version_id)
        if identity is None:
            return None
        return f"{endpoint.scheme}://{endpoint.host}:{endpoint.port}\n{identity}\n{version.mtime_ns or 0}"

    def fileno(self) -> int | None:
        return None

    def stat(self) -> SourceStat:
        """A read-only regular file of the object's size, modified when the object was (Last-Modified)."""
        return SourceStat.read_only(self.size, self._mtime_ns)

    def reopen(self) -> None:
        """In a forked process: the parent's connections and worker threads are not this process's."""
        self._getter.reset()
        self._parts.reset()
        self._pending = {}
        self._lock = threading.Lock()
        self._cache.drop_blocks()
        self._store.close()
        self._store = self._cache.store = BlockStore(self._cache.capacity)

    def close(self) -> None:
        self._parts.close()
        self._getter.close()
        with self._lock:
            self._store.close()


def _parts(start: int, length: int, block: int, part: int = PART) -> list[tuple[int, int]]:
    """``[start, start + length)`` in equal parts of at most ``part`` bytes and a block, of whole ``block``s (none is
    a small straggler, nor a read-ahead step of a little more than ``part`` two halves)."""
    if length <= 0:
        return []
    count = max(1, -(-(length - block) // part))
    size = -(-length // count // block) * block
    return [(at, min(at + size, start + length)) for at in range(start, start + length, size)]

