"""Work that follows a writer, on a thread beside it: ``Behind`` runs tasks in order, a bounded number behind;
``WriteBack`` starts the disk's writeback of a file's ranges as they are written.

A file written through the page cache and then fsynced (``cp`` then ``sync``,
``dd conv=fsync``) is written to the disk only at the end, after the copying.
Started range by range (``sync_file_range(SYNC_FILE_RANGE_WRITE)``, which
queues the writes without waiting for them), the disk writes while the writer
goes on, and the final ``fsync`` finds little left. The call may wait while the
disk's queue is full, so it runs on its own thread.
"""

from __future__ import annotations

import collections
import ctypes
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

BEHIND = 32
"""Tasks that may be pending: how far a writer may run ahead of the work behind it before it waits."""
UNIT = 8 << 20
"""Bytes written before their writeback is started: fewer, larger requests."""
_SYNC_FILE_RANGE_WRITE = 2


class Behind:
    """Tasks done in submission order on one thread, at most ``BEHIND`` pending; the first error raised."""

    def __init__(self, name: str) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"ckptfs-{name}")
        self._pending: collections.deque[Future[object]] = collections.deque()

    def submit(self, task: Callable[[], object]) -> None:
        while len(self._pending) >= BEHIND:
            self._pending.popleft().result()
        self._pending.append(self._pool.submit(task))

    def wait(self) -> None:
        """Every task done; the first one's error raised."""
        while self._pending:
            self._pending.popleft().result()

    def close(self) -> None:
        """Pending tasks dropped, the running one waited for: the thread never outlives what its tasks use."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._pending.clear()


def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    try:
        call = ctypes.CDLL(None).sync_file_range
    except (OSError, AttributeError):  # not Linux: the final fsync writes everything
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    call.restype = ctypes.c_int
    return call  # type: ignore[no-any-return]


_START = _sync_file_range()


class WriteBack:
    """The writeback of file ``fd``'s ranges started as they are written (``written``), ``UNIT`` at a time.
    Thread-safe.

    Only a hint: its result is not looked at, a write error is the final fsync's to report."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._behind = Behind("write-back") if _START is not None else None
        self._run = (0, 0)
        """The written range whose writeback is not started yet: consecutive writes gather in it."""
        self._lock = threading.Lock()

    def written(self, position: int, count: int) -> None:
        with self._lock:
            start, end = self._run
            if position != end or end - start >= UNIT:
                self._flush()
                start = position
            self._run = (start, position + count)

    def _flush(self) -> None:
        start, end = self._run
        if self._behind is not None and end > start:
            fd = self.fd
            self._behind.submit(lambda: _START(fd, start, end - start, _SYNC_FILE_RANGE_WRITE))  # type: ignore[misc]
        self._run = (0, 0)

    def close(self) -> None:
        """No more writeback started; the thread gone."""
        if self._behind is not None:
            self._behind.close()
