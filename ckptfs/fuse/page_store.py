"""Files' bytes pushed into the kernel's page cache (``fuse_lowlevel_notify_store``), so that reading them
needs no READ request at all.

A read-only mount answers opens with ENOSYS (``fuse.inodes``), which makes the
kernel keep a file's pages from one open to the next; stored pages stay until
evicted (sizes never change while mounted, so attribute refreshes keep them).

The stores are made by a thread of their own, never by the thread answering
requests: the kernel locks a page while a read of it waits for its READ, and a
store into that page waits for the lock, so a store made by the only thread that
could answer that READ would wait forever. A store that fails (the inode not or
no longer in the kernel, the session ending) is dropped: the file is then read
as before.
"""

from __future__ import annotations

import ctypes
import queue
import signal
import threading

from ckptfs.fuse import bindings as libfuse
from ckptfs.fuse import lowlevel as ll

STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""Blocked in the storing thread: libfuse's handlers must interrupt the request loop's read, not this thread."""

Batch = list[tuple[int, bytes]]
"""``(inode number, the file's whole bytes)`` pairs."""


class PageStore:
    """Stores batches of whole files into the kernel's page cache of ``session``, in order, from one thread."""

    def __init__(self, session: int) -> None:
        self._session = session
        self._batches: queue.SimpleQueue[Batch | None] = queue.SimpleQueue()
        self.stored = self.failed = 0
        """Files stored, and those whose store failed (counted for tests and logs)."""
        self._thread = threading.Thread(target=self._run, name="ckptfs-page-store", daemon=True)
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOPPING_SIGNALS)  # inherited by the thread
        try:
            self._thread.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)

    def put(self, batch: Batch) -> None:
        if batch:
            self._batches.put(batch)

    def close(self) -> None:
        """Lets the thread store what is queued and end (before the session is destroyed: it uses it)."""
        self._batches.put(None)
        self._thread.join()

    def _run(self) -> None:
        bufvec = libfuse.FuseBufvec()
        buf = bufvec.buf[0]
        address = ctypes.addressof(bufvec)
        while (batch := self._batches.get()) is not None:
            for ino, data in batch:
                held = ctypes.c_char_p(data)  # points into ``data``: no copy; kept alive by ``data`` in ``batch``
                bufvec.count, bufvec.idx, bufvec.off = 1, 0, 0
                buf.size, buf.flags, buf.mem, buf.fd, buf.pos = len(data), 0, ctypes.cast(held, ctypes.c_void_p).value, -1, 0
                if ll.notify_store(self._session, ino, 0, address, 0) == 0:
                    self.stored += 1
                else:
                    self.failed += 1
