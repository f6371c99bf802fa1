"""The GETs of one remote object on a bounded set of connections, and how many parts a stream keeps in flight.

Object stores cap each connection (S3: ~50-100 MB/s); the fast clients (s3torchconnector's CRT, obstore) split a
read into parts fetched on many connections at once. ``PartPool`` runs fetches on at most ``connections``
threads, each with its own keep-alive connection (``RangedGetter`` keeps one a thread): a reader's parts before
read-ahead's, in the order asked. It measures the rate of each connection over its GETs of at least
``MEASURED`` bytes, and from it says how many parts a sequential stream keeps in flight (``parts``): enough for
``STREAM_RATE``, the rate a reader through FUSE consumes, so one over loopback and up to ``connections`` behind a
per-connection cap. Each answer is checked by the getter on its own connection: the pinned version, the range,
the framing.
"""

from __future__ import annotations

import itertools
import math
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Any, Callable

from ckptfs.sources.remote.options import DEFAULT_MAX_CONNECTIONS
from ckptfs.sources.remote.ranged_get import RangedGetter

MiB = 1 << 20
STREAM_RATE = 1e9
"""Bytes a second a sequential stream is given parts in flight for: about what a reader consumes through the
FUSE mount (a local file's ``dd`` through it: ~1 GB/s on 2 cores)."""
MEASURED = 1 * MiB
"""GETs this large or larger tell a connection's rate; smaller ones are mostly latency."""
RATE_SAMPLES = 16
MIN_PARTS = 2
"""Parts a stream keeps in flight before any rate is measured, and at least: one arriving, one being asked."""


class PartPool:
    def __init__(self, getter: RangedGetter, connections: int = DEFAULT_MAX_CONNECTIONS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if connections < 1:
            raise ValueError("at least one connection")
        self.getter = getter
        self.connections = connections
        self.clock = clock
        self._samples: deque[tuple[int, float]] = deque(maxlen=RATE_SAMPLES)
        self.reset()

    def reset(self) -> None:
        """A pool with no thread running (a forked process's: the parent's threads are not its own)."""
        self._lock = threading.Lock()
        self._queue: queue.PriorityQueue[tuple[int, int, Any]] = queue.PriorityQueue()
        self._order = itertools.count()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self.busy = 0
        """Tasks running now (tests: never more than ``connections``)."""
        self.most_busy = 0

    def on_own_thread(self) -> bool:
        return threading.current_thread() in self._threads

    def fetch(self, start: int, view: memoryview) -> None:
        """One GET filling ``view`` from ``start``, on the calling thread; timed for the connection's rate."""
        began = self.clock()
        self.getter.get_into(start, view)
        self.measured(len(view), began)

    def measured(self, count: int, began: float) -> None:
        """Takes a GET of ``count`` bytes begun at ``began`` (a ``clock`` reading) into the connection's rate."""
        if count >= MEASURED:
            with self._lock:
                self._samples.append((count, self.clock() - began))

    def rate(self) -> float | None:
        """Bytes a second one connection fetched, over its last large GETs; None before the first."""
        with self._lock:
            count = sum(n for n, _ in self._samples)
            seconds = sum(s for _, s in self._samples)
        if not count:
            return None
        return count / max(seconds, 1e-9)

    def parts(self) -> int:
        """Parts a sequential stream keeps in flight: STREAM_RATE over one connection's rate, within
        MIN_PARTS and ``connections``."""
        rate = self.rate()
        wanted = MIN_PARTS if rate is None else math.ceil(STREAM_RATE / rate)
        return max(1, min(self.connections, max(MIN_PARTS, wanted)))

    def submit(self, task: Callable[[], None], urgent: bool) -> Future[None]:
        """Runs ``task`` on one of the pool's threads: an ``urgent`` one (a reader waits for it) before the
        others, each kind in the order submitted."""
        future: Future[None] = Future()
        with self._lock:
            self._queue.put((0 if urgent else 1, next(self._order), (task, future)))
            if self._idle == 0 and len(self._threads) < self.connections:
                thread = threading.Thread(target=self._work, name="ckptfs-get", daemon=True)
                self._threads.append(thread)
                thread.start()
            else:
                self._idle -= 1
        return future

    def _work(self) -> None:
        while True:
            _, _, item = self._queue.get()
            if item is None:
                return
            task, future = item
            with self._lock:
                self.busy += 1
                self.most_busy = max(self.most_busy, self.busy)
            if future.set_running_or_notify_cancel():
                try:
                    task()
                    future.set_result(None)
                except BaseException as exc:
                    future.set_exception(exc)
            with self._lock:
                self.busy -= 1
                self._idle += 1

    def close(self) -> None:
        """Cancels what has not started, waits for what has, and ends the threads."""
        with self._lock:
            threads, self._threads = self._threads, []
            pending = []
            while True:
                try:
                    pending.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            for _, _, item in pending:
                if item is not None:
                    item[1].cancel()
            for _ in threads:
                self._queue.put((2, next(self._order), None))
        for thread in threads:
            thread.join()
