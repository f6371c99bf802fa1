"""A local file read with ``os.pread``, so concurrent readers never share a file position."""

from __future__ import annotations

import os
import stat

from ckptfs.errors import SourceError
from ckptfs.sources.base import SourceStat


class LocalFileSource:
    """A local file read with ``os.pread`` (thread-safe, no shared position)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.name = os.fspath(path)
        try:
            # O_NONBLOCK: opening a FIFO would otherwise wait for a writer; it is refused below as not regular.
            self._fd = os.open(self.name, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise SourceError(f"cannot open: {exc.strerror}", self.name) from exc
        try:
            st = os.fstat(self._fd)
        except OSError as exc:
            os.close(self._fd)
            raise SourceError(f"cannot stat: {exc.strerror}", self.name) from exc
        if not stat.S_ISREG(st.st_mode):
            os.close(self._fd)
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise SourceError(f"{kind}, not a checkpoint file", self.name)
        self.size = st.st_size
        self._stat = SourceStat.of(st)

    def read(self, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise SourceError(
                f"read of {length} bytes at offset {offset} is outside the file "
                f"({self.size} bytes)",
                self.name,
            )
        try:
            data = os.pread(self._fd, length, offset)
        except OSError as exc:
            raise SourceError(f"read failed at offset {offset}: {exc.strerror}", self.name) from exc
        if len(data) != length:
            data = self._read_rest(data, offset, length)
        return data

    def _read_rest(self, data: bytes, offset: int, length: int) -> bytes:
        parts = [data]
        got = len(data)
        while got < length:
            chunk = os.pread(self._fd, length - got, offset + got)
            if not chunk:
                raise SourceError(
                    f"short read: {got} of {length} bytes at offset {offset} "
                    "(was the file truncated?)",
                    self.name,
                )
            parts.append(chunk)
            got += len(chunk)
        return b"".join(parts)

    def fileno(self) -> int | None:
        return self._fd

    def stat(self) -> SourceStat:
        """As the file was when opened: the mount treats its source as immutable."""
        return self._stat

    def reopen(self) -> None:
        """Nothing to do: a forked child shares the descriptor, and every read is a ``pread``."""

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
