"""Reads that must wait on the network, answered from a few threads of their own (``fuse.inodes``).

On libfuse's low-level API a request may be answered from any thread. A read the remote cache misses is handed
here, and the FUSE loop goes on answering the others (cache hits, listings, attributes) instead of waiting behind
one reader's GET; the worker sends the reply itself. The threads spend their time waiting on sockets, without the
GIL, so a single-threaded FUSE loop with this pool keeps many readers' GETs in flight without as many FUSE
threads contending for the GIL. ``finish`` lets the reads under way answer before the session is unmounted: a
reply written after that would go to a closed (perhaps reused) descriptor.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

HOLDS = "holds"
"""Optional method of a source, ``holds(offset, length) -> bool``: whether those bytes are at hand, so that a read
of them waits on nothing (a remote source's cache holds them)."""

WAITING_READS = 16
"""Threads answering reads that wait: as many readers' fetches at once as ``--max-connections``' default."""


class ReadPool:
    """Runs ``answer(req)`` on one of at most WAITING_READS threads, made on first use (in the daemon, after the
    fork). Once ``finish`` has begun, a read not yet started gets ``refuse(req)`` instead."""

    def __init__(self, refuse: Callable[[int], object], threads: int = WAITING_READS) -> None:
        self._refuse = refuse
        self._threads = threads
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._finishing = False

    def submit(self, req: int, answer: Callable[[int], None]) -> None:
        with self._lock:
            if self._finishing:
                self._refuse(req)
                return
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self._threads, thread_name_prefix="ckptfs-read")
            self._executor.submit(self._run, req, answer)

    def _run(self, req: int, answer: Callable[[int], None]) -> None:
        if self._finishing:
            self._refuse(req)
        else:
            answer(req)

    def finish(self) -> None:
        """Waits for the reads under way to be answered; those queued are refused."""
        with self._lock:
            self._finishing = True
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)
