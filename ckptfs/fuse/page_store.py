"""Files' bytes pushed into the kernel's page cache (``fuse_lowlevel_notify_store``), so that reading them
needs no READ request at all.

A read-only mount answers opens with ENOSYS (``fuse.inodes``), which makes the
kernel keep a file's pages from one open to the next; stored pages stay until
evicted (sizes never change while mounted, so attribute refreshes keep them).

The stores are made by a thread of their own, never by the thread answering
requests: the kernel locks a page while a read of it waits for its READ, and a
store into that page waits for the lock, so a store made by the only thread that
could answer that READ would wait forever. For the same reason, when the request
loop has ended (a signal stops it while mounted), requests are still answered
here until the storing thread is done: its last store may wait for such a READ,
and the kernel, which would fail that READ once the session's device is closed,
does not while a store is being written to it. A store that fails (the inode not
or no longer in the kernel, the session ending) is dropped: the file is then read
as before.
"""

from __future__ import annotations

import ctypes
import logging
import queue
import select
import signal
import threading

from ckptfs.fuse import bindings as libfuse
from ckptfs.fuse import lowlevel as ll

log = logging.getLogger("ckptfs.fuse.mount")
DRAIN_POLL = 0.05
"""Seconds between checks of the storing thread while requests are answered after the loop."""
Batch = list[tuple[int, bytes]]
"""``(inode number, the file's whole bytes)`` pairs."""


class PageStore:
    """Stores batches of whole files into the kernel's page cache of ``session``, in order, from one thread."""

    def __init__(self, session: int) -> None:
        self._session = session
        self._batches: queue.SimpleQueue[Batch | None] = queue.SimpleQueue()
        self._closing = False
        self.stored = self.failed = 0
        """Files stored, and those whose store failed (logged at the end)."""
        self._thread = threading.Thread(target=self._run, name="ckptfs-page-store", daemon=True)
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, ll.STOPPING_SIGNALS)  # inherited by the thread
        try:
            self._thread.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)

    def put(self, batch: Batch) -> None:
        if batch:
            self._batches.put(batch)

    def close(self) -> None:
        """Once the request loop has ended, before the session is unmounted: drops what is queued and answers
        requests until the thread's last store is done."""
        self._closing = True
        self._batches.put(None)
        fd = ll.session_fd(self._session)
        poller = select.poll()
        answering = fd >= 0
        if answering:
            poller.register(fd, select.POLLIN)
        buf = libfuse.FuseBuf()  # its memory allocated by libfuse, freed here
        try:
            while self._thread.is_alive():
                events = poller.poll(DRAIN_POLL * 1000) if answering else []
                if any(flags & (select.POLLERR | select.POLLHUP | select.POLLNVAL) for _, flags in events):
                    answering = False  # unmounted: the kernel fails every request itself
                elif events:
                    ll.session_reset(self._session)  # the loop's end marked it exited: it would read and drop one
                    if ll.session_receive_buf(self._session, ctypes.byref(buf)) > 0:
                        ll.session_process_buf(self._session, ctypes.byref(buf))
                self._thread.join(0 if answering else DRAIN_POLL)
        finally:
            libfuse.free_received(buf)
        log.debug("page store: %d files stored, %d stores failed", self.stored, self.failed)

    def _run(self) -> None:
        bufvec = libfuse.FuseBufvec()
        buf = bufvec.buf[0]
        address = ctypes.addressof(bufvec)
        while (batch := self._batches.get()) is not None:
            for ino, data in batch:
                if self._closing:
                    break
                held = ctypes.c_char_p(data)  # points into ``data``: no copy; kept alive by ``data`` in ``batch``
                bufvec.count, bufvec.idx, bufvec.off = 1, 0, 0
                buf.size, buf.flags, buf.fd, buf.pos = len(data), 0, -1, 0
                buf.mem = ctypes.cast(held, ctypes.c_void_p).value
                if ll.notify_store(self._session, ino, 0, address, 0) == 0:
                    self.stored += 1
                else:
                    self.failed += 1
