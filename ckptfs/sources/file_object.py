"""``FileObjectSource``: an open binary file object (``seek`` and ``read``) as a byte source."""

from __future__ import annotations

import io
import threading
from typing import Any

from ckptfs.errors import SourceError
from ckptfs.sources.base import SourceStat


class FileObjectSource:
    """An open binary file object; reads take a lock, as they share its position."""

    def __init__(self, file: Any, name: str | None = None) -> None:
        self._file = file
        self._lock = threading.Lock()
        self.name = name or str(getattr(file, "path", None) or getattr(file, "name", None) or repr(file))
        try:
            self.size = int(file.seek(0, io.SEEK_END))
        except (OSError, ValueError) as exc:
            raise SourceError(f"cannot seek to the end: {exc}", self.name) from exc

    def read(self, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise SourceError(f"read of {length} bytes at offset {offset} is outside the file ({self.size} bytes)",
                              self.name)
        parts, got = [], 0
        with self._lock:
            try:
                self._file.seek(offset)
                while got < length:
                    chunk = self._file.read(length - got)
                    if not chunk:
                        raise SourceError(f"short read: {got} of {length} bytes at offset {offset}", self.name)
                    parts.append(chunk)
                    got += len(chunk)
            except (OSError, ValueError) as exc:
                raise SourceError(f"read failed at offset {offset}: {exc}", self.name) from exc
        return b"".join(parts)

    def fileno(self) -> int | None:
        return None

    def stat(self) -> SourceStat | None:
        return None

    def reopen(self) -> None:
        """Nothing to do: the file object is the caller's."""

    def close(self) -> None:
        """Nothing to do: the file object is the caller's to close."""
