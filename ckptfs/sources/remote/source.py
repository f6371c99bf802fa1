"""``RemoteSource``: an object read by ranged GETs, through a bounded cache with sequential read-ahead.

Opening costs one request, the suffix GET, whose bytes stay cached: a zip's end records and central directory
are read from them without another request. A read the cache misses fetches from its first missing block to
where read-ahead says (``cache.ReadAhead``), only the gaps; large fetches go in parallel parts, and a read larger
than a quarter of the cache goes straight into its result, uncached. A sequential stream's next window is
fetched in the background while the reader consumes the current one, and at full size its lead is topped up
in parts by several GETs at once (``cache.PREFETCH_STEP``); a read needing bytes of a background fetch waits for
it rather than fetching them twice. Fetches go into buffers reused once evicted (``cache.BufferPool``). Told
where the checkpoint's storages lie (``set_extents``), read-ahead stops at a storage's end until the reader goes
on into the next (``cache.ReadAhead``). With a disk cache (``disk_cache``), fetches are whole 1 MiB blocks, read
from disk when a checked copy is there.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from ckptfs.errors import SourceError
from ckptfs.sources.base import SourceStat
from ckptfs.sources.remote.cache import BLOCK, BufferPool, ExtentCache, ReadAhead
from ckptfs.sources.remote.disk_cache import UNIT, DiskBlocks, DiskCacheSetting, object_identity
from ckptfs.sources.remote.ranged_get import ObjectVersion, RangedGetter

MiB = 1 << 20
PART = 8 * MiB
"""Fetches larger than this are split in parts fetched at once (object stores serve ~100 MB/s a stream)."""
PARALLEL = 8
POOL_SIZE = 64 * MiB
"""Free fetch buffers kept for reuse (``cache.BufferPool``)."""
AHEAD_THREADS = 4
"""Read-ahead fetches in flight at once: a stream's MAX_WINDOW lead is topped up in PREFETCH_STEP parts."""
log = logging.getLogger("ckptfs.sources.remote")


class RemoteSource:
    def __init__(self, getter: RangedGetter, cache_size: int, tail_size: int,
                 disk_cache: DiskCacheSetting | None = None, pinned: ObjectVersion | None = None) -> None:
        """``pinned``: the version an earlier open pinned (``pinned``): opened without a request, read at it."""
        self._getter = getter
        self.name = getter.endpoint.name
        if pinned is None:
            tail = getter.get_tail(tail_size)
        else:
            getter.version, tail = pinned, b""
        assert getter.version is not None
        self.size = getter.version.size
        self._mtime_ns = getter.version.mtime_ns or 0
        self._lock = threading.Lock()
        self._buffers = BufferPool(min(POOL_SIZE, cache_size))
        self._cache = ExtentCache(cache_size, self._buffers)
        if tail:
            self._cache.put(self.size - len(tail), tail, pinned=True)
        self.tail_hint = len(tail) or min(tail_size, self.size)
        """Opening a checkpoint reads this tail first: the suffix request above holds it (``sources.base``); opened
        pinned, one GET of it."""
        self._disk = self._disk_blocks(disk_cache)
        self._ahead = ReadAhead(BLOCK if self._disk is None else UNIT)
        self._pool: ThreadPoolExecutor | None = None
        self._background: ThreadPoolExecutor | None = None
        self._pending: dict[int, tuple[int, Future[None]]] = {}
        """Background fetches under way: start -> (end, its future)."""

    def read(self, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise SourceError(f"read of {length} bytes at offset {offset} is outside the object "
                              f"({self.size} bytes)", self.name)
        end = offset + length
        with self._lock:
            data = self._cache.held(offset, end)
            if data is not None:
                self._start_prefetch(self._ahead.prefetch(end, self.size))
                return data
            waiting = [f for start, (stop, f) in self._pending.items() if start < end and offset < stop]
        for future in waiting:
            future.exception()  # its failure is not this read's: the gaps it leaves are fetched below
        result = bytearray(length)
        view = memoryview(result)
        large = length > self._cache.capacity // 4
        with self._lock:
            self._cache.copy_into(offset, view)
            gaps = self._cache.gaps(offset, end)
            if gaps and not large:
                fetch_start = gaps[0][0] // self._ahead.block * self._ahead.block
                gaps = self._cache.gaps(fetch_start, self._ahead.fetch_end(gaps[0][0], end, self.size))
        if not gaps:
            return bytes(result)
        if large:
            for start, stop in gaps:
                self._fetch_into(start, view[start - offset : stop - offset])
            return bytes(result)
        fetched = []
        for start, stop in gaps:
            data = self._buffer(stop - start)
            self._fetch_into(start, data)
            fetched.append((start, data))
            first, last = max(start, offset), min(stop, end)
            if first < last:
                view[first - offset : last - offset] = data[first - start : last - start]
        with self._lock:
            for start, data in fetched:
                self._cache.put(start, data)
        return bytes(result)

    def _start_prefetch(self, wanted: tuple[int, int] | None) -> None:
        """Under the lock: fetches the gaps of ``wanted`` in the background."""
        if wanted is None:
            return
        for start, stop in self._cache.gaps(*wanted):
            if any(s < stop and start < e for s, (e, _) in self._pending.items()):
                continue
            if self._background is None:
                self._background = ThreadPoolExecutor(AHEAD_THREADS, thread_name_prefix="ckptfs-ahead")
            self._pending[start] = (stop, self._background.submit(self._prefetch, start, stop))

    def _prefetch(self, start: int, stop: int) -> None:
        try:
            data = self._buffer(stop - start)
            self._fetch_into(start, data)
            with self._lock:
                self._cache.put(start, data)
        except Exception as exc:  # a reader that needs these bytes fetches them itself, and reports its error
            log.info("%s: read-ahead of %d bytes at offset %d: %s", self.name, stop - start, start, exc)
        finally:
            with self._lock:
                del self._pending[start]

    def _buffer(self, size: int) -> memoryview:
        """A buffer to fetch ``size`` bytes into, which the cache owns once they are put in it."""
        with self._lock:
            return self._buffers.take(size)

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

    def _fetch_into(self, start: int, view: memoryview) -> None:
        """The object's bytes from ``start``: the disk cache's blocks, GETs for the rest. A GET covers whole
        blocks (one starting or ending next to bytes held in memory is widened) so that the disk keeps them."""
        disk = self._disk
        if disk is None:
            self._get_into(start, view)
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
                self._get_into(first, whole)
            else:
                whole = memoryview(bytearray(whole_end - whole_start))
                self._get_into(whole_start, whole)
                view[first - start : last - start] = whole[first - whole_start : last - whole_start]
            for index in range(whole_start // UNIT, -(-whole_end // UNIT)):
                unit_start, unit_end = disk.unit_range(index)
                disk.store(index, whole[unit_start - whole_start : unit_end - whole_start])

    def _get_into(self, start: int, view: memoryview) -> None:
        """One GET, or parts of at most PART bytes fetched at once."""
        if len(view) <= PART:
            self._getter.get_into(start, view)
            return
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(PARALLEL, thread_name_prefix="ckptfs-get")
            pool = self._pool
        count = -(-len(view) // PART)
        size = -(-len(view) // count // BLOCK) * BLOCK  # equal parts: none is a small straggler
        parts = [(start + at, view[at : at + size]) for at in range(0, len(view), size)]
        for future in [pool.submit(self._getter.get_into, *part) for part in parts]:
            future.result()

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
        self._pool = self._background = None
        self._pending = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        for pool in (self._background, self._pool):
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
        self._pool = self._background = None
        self._getter.close()
