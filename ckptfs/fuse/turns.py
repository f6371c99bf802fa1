"""libfuse's request loop on Python threads, for reads that wait on the network.

Two threads (RECEIVERS) wait in ``fuse_session_receive_buf``; the kernel hands each request to one, which answers
it on the spot and goes back to receiving, so while one answers, the other takes the next request. A read about to
wait on a store (a remote cache miss, ``fuse.inodes``) first calls ``handoff``: if no other thread is receiving,
a thread beyond the two (up to ``threads``) starts receiving. So one reader waiting never stalls the others, and a
read costs no thread switch besides the kernel's wakeup of a receiver, as with one thread: handing waiting reads
to a pool (~35 µs more for a random 4 KiB read on loopback) or making a follower receive on every miss (~40 µs)
costs a wakeup on the read's own path. Threads made here keep their Python thread state, which libfuse's own
multithreaded loop's threads make anew on every callback.

Only the main thread takes the stopping signals (libfuse's handlers end the session); it then wakes the
receivers out of their reads with SIGUSR1. The loop returns once every thread has answered its request and ended:
no reply is written after the session is unmounted.
"""

from __future__ import annotations

import ctypes
import errno
import signal
import threading
from types import FrameType

from ckptfs.fuse import bindings as libfuse
from ckptfs.fuse import lowlevel as ll

WAKE = signal.SIGUSR1
"""Sent to the threads receiving to end their reads once the session has ended."""
RECEIVERS = 2
"""Threads in ``fuse_session_receive_buf`` at most: while one answers a request, another takes the next."""
POLL = 0.25
"""Seconds between the main thread's looks at whether a signal ended the session."""


class TakingTurns:
    def __init__(self, session: int, threads: int) -> None:
        self._session = session
        self._max_threads = threads
        self._lock = threading.Lock()
        self._turn = threading.Condition(self._lock)
        """Threads beyond the RECEIVERS wait on it to receive."""
        self._ended = threading.Condition(self._lock)
        self._receiving: set[int] = set()
        """The threads in ``fuse_session_receive_buf``, by ident."""
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._done = False
        self._status = 0

    def run(self) -> int:
        """Answers requests until the session ends; the first error of a receive (negative), else 0."""
        previous = signal.signal(WAKE, _woken)
        try:
            with self._lock:
                for _ in range(RECEIVERS):
                    self._start()
                while not self._done:
                    self._ended.wait(POLL)
                    if not self._done and ll.session_exited(self._session):
                        self._end(0)
            for thread in list(self._threads):
                while thread.is_alive():
                    with self._lock:
                        self._wake_receivers()  # one that had not yet begun its read when first woken
                    thread.join(POLL)
        finally:
            signal.signal(WAKE, previous)
        return self._status

    def handoff(self) -> None:
        """Called by a request's callback about to wait: if no other thread is receiving, one is made to."""
        with self._lock:
            if self._receiving or self._done:
                return
            if self._idle:
                self._turn.notify()
            elif len(self._threads) < self._max_threads:
                self._start()

    def _start(self) -> None:
        """Under the lock."""
        thread = threading.Thread(target=self._work, name=f"ckptfs-fuse-{len(self._threads)}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _work(self) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, ll.STOPPING_SIGNALS)
        me = threading.get_ident()
        buf = libfuse.FuseBuf()
        try:
            while True:
                with self._lock:
                    while len(self._receiving) >= RECEIVERS and not self._done:
                        self._idle += 1
                        self._turn.wait()
                        self._idle -= 1
                    if self._done:
                        return
                    self._receiving.add(me)
                received = ll.session_receive_buf(self._session, ctypes.byref(buf))
                with self._lock:
                    self._receiving.discard(me)  # never signalled once out of its read
                if received == -errno.EINTR:
                    continue
                if received <= 0:  # 0: unmounted
                    with self._lock:
                        self._end(min(received, 0))
                    return
                ll.session_process_buf(self._session, ctypes.byref(buf))
        finally:
            libfuse.free_received(buf)

    def _end(self, status: int) -> None:
        """Under the lock."""
        if not self._done:
            self._done, self._status = True, status
        self._turn.notify_all()
        self._ended.notify_all()
        self._wake_receivers()

    def _wake_receivers(self) -> None:
        """Under the lock: interrupts the reads of those receiving (each leaves the set under it first)."""
        for ident in self._receiving:
            signal.pthread_kill(ident, WAKE)


def _woken(signum: int, frame: FrameType | None) -> None:
    """WAKE's handler: its delivery alone interrupts the leader's read."""
