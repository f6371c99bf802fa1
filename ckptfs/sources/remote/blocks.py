"""Memory for fetched bytes that the kernel can read by itself: blocks of one ``memfd``, mapped into the process.

A GET's body is read straight into a block's mapped window (``Block.view``), and the mount answers a read of it
with a file-descriptor buffer (``fileno``, ``Block.offset``), as it answers from a local file: the bytes never
become a Python object, and libfuse copies them from the memfd into its reply itself.

The memfd is as large as the cache (``--cache-size``); its pages are only allocated when first written, and a
block freed is reused first (lowest offset first), so its pages are warm. A fetch the memfd has no contiguous room
for gets private memory (``Block.offset`` -1), still counted by the cache. A block a reply is still being sent
from (``leases``) is not reused until the reply is done (``release``). Not thread-safe: the source's lock guards
the cache and this store together. Made on first use, in the process that uses it (a forked daemon makes its
own: a memfd mapped before a fork is shared with the parent).
"""

from __future__ import annotations

import bisect
import mmap
import os

GRAIN = 64 * 1024
"""Blocks start and end on these boundaries in the memfd (a fetch's size is a multiple of the cache's block)."""
POPULATE = 1 << 20
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)


class Block:
    """``size`` fetched bytes: at ``offset`` in the store's memfd, or private memory (``offset`` -1)."""

    __slots__ = ("evicted", "fresh", "leases", "offset", "size", "view")

    def __init__(self, offset: int, size: int, view: memoryview,
                 fresh: tuple[mmap.mmap, int, int] | None = None) -> None:
        self.offset = offset
        self.size = size
        self.view = view
        """Writable: a fetch fills it; read-only in use once the cache holds it."""
        self.fresh = fresh
        """Pages of the memfd never written that this block (and a little past it) lies on: ``populate`` them."""
        self.leases = 0
        """Replies being sent from it now."""
        self.evicted = False
        """The cache dropped it while leased: it goes back to the store once the last lease ends."""

    def __len__(self) -> int:
        return self.size

    def populate(self) -> None:
        """Allocates the block's pages never written in one call (``MADV_POPULATE_WRITE``), and those up to the next
        POPULATE boundary past it: cheaper than the fault a fetch's first write of each page takes (a tenth of a
        GiB's CPU time for 4 KiB pages; a random 4 KiB read's 64 KiB fetch, 16 of them). Outside the source's lock:
        the pages past the block may be another's, which populating leaves as they are."""
        if self.fresh is not None:
            mapped, start, stop = self.fresh
            self.fresh = None
            try:
                mapped.madvise(MADV_POPULATE_WRITE, start, stop - start)
            except (OSError, ValueError):
                pass  # a kernel before 5.14, or the store closed: the pages fault in as the fetch writes them


class BlockStore:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity // GRAIN * GRAIN
        self._fd = -1
        self._map: mmap.mmap | None = None
        self._starts: list[int] = []
        """Free runs of the memfd: their offsets, sorted, and lengths (``_lengths``)."""
        self._lengths: dict[int, int] = {}
        self._touched = 0
        """The memfd's pages below this offset are allocated (blocks are taken lowest first, ``Block.populate``)."""

    def fileno(self) -> int:
        """The memfd (made on first use)."""
        if self._fd < 0:
            self._open()
        return self._fd

    def _open(self) -> None:
        fd = os.memfd_create("ckptfs-blocks", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, max(self.capacity, GRAIN))
            self._map = mmap.mmap(fd, max(self.capacity, GRAIN), mmap.MAP_SHARED,
                                  mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._starts, self._lengths = ([0], {0: self.capacity}) if self.capacity else ([], {})

    def fresh(self, size: int) -> bool:
        """Whether a block of ``size`` bytes would be taken from pages never written (or private memory)."""
        grains = -(-size // GRAIN) * GRAIN
        start = next((s for s in self._starts if self._lengths[s] >= grains), None)
        return start is None or start + grains > self._touched

    def take(self, size: int) -> Block:
        """A block of ``size`` bytes (contents not zeroed): in the memfd where a free run holds it, else private."""
        if self._fd < 0:
            self._open()
        grains = -(-size // GRAIN) * GRAIN
        for index, start in enumerate(self._starts):
            length = self._lengths[start]
            if length < grains:
                continue
            del self._starts[index], self._lengths[start]
            if length > grains:
                self._starts.insert(index, start + grains)
                self._lengths[start + grains] = length - grains
            assert self._map is not None
            fresh = None
            if start + grains > self._touched:
                stop = min(self.capacity, -(-(start + grains) // POPULATE) * POPULATE)
                fresh = (self._map, max(start, self._touched), stop)
                self._touched = stop
            return Block(start, size, memoryview(self._map)[start : start + size], fresh)
        return Block(-1, size, memoryview(bytearray(size)))

    def give(self, block: Block) -> None:
        """Takes back a block nothing holds any more; one still leased goes back when its last lease ends."""
        if block.leases:
            block.evicted = True
            return
        if block.offset < 0 or self._fd < 0:
            return
        start, end = block.offset, block.offset + -(-block.size // GRAIN) * GRAIN
        index = bisect.bisect_left(self._starts, start)
        if index < len(self._starts) and self._starts[index] == end:  # joins the free run after it
            end += self._lengths.pop(end)
            del self._starts[index]
        if index > 0 and (before := self._starts[index - 1]) + self._lengths[before] == start:
            self._lengths[before] = end - before  # and the one before
            return
        self._starts.insert(index, start)
        self._lengths[start] = end - start

    def lease(self, block: Block) -> None:
        """A reply is sent from ``block`` from now on, until ``release``."""
        block.leases += 1

    def release(self, block: Block) -> None:
        block.leases -= 1
        if not block.leases and block.evicted:
            block.evicted = False
            self.give(block)

    def free_bytes(self) -> int:
        """Bytes of the memfd no block holds (tests)."""
        return sum(self._lengths.values()) if self._fd >= 0 else self.capacity

    def close(self) -> None:
        """Closes the memfd; its mapping goes once no block's view is left (the cache dropped them)."""
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = -1
        self._map = None
        self._starts, self._lengths = [], {}
