"""A source that records every read: how the tests prove that opening and reading are lazy."""

from __future__ import annotations

import threading

from ckptfs.sources import ByteSource, SourceStat


class CountingSource:
    """``tail_hint``: the one a remote source declares (the bytes its suffix request at open holds)."""

    def __init__(self, inner: ByteSource, tail_hint: int = 0) -> None:
        self.inner = inner
        self.name = inner.name
        self.size = inner.size
        self.tail_hint = tail_hint
        self.reads: list[tuple[int, int]] = []
        self._lock = threading.Lock()

    @property
    def bytes_read(self) -> int:
        return sum(length for _, length in self.reads)

    def read(self, offset: int, length: int) -> bytes:
        with self._lock:
            self.reads.append((offset, length))
        return self.inner.read(offset, length)

    def fileno(self) -> int | None:
        return self.inner.fileno()

    def stat(self) -> SourceStat | None:
        return self.inner.stat()

    def reopen(self) -> None:
        self.inner.reopen()

    def close(self) -> None:
        self.inner.close()
