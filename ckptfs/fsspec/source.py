"""Byte sources for what fsspec hands the ``ckpt`` file system: a file of another fsspec file system, or an
open binary file object."""

from __future__ import annotations

import io
import threading
from typing import Any

from ckptfs.errors import SourceError
from ckptfs.sources import SourceStat


class FsspecFileSource:
    """A file of an fsspec file system, read with ranged ``cat_file`` calls (stateless, so thread-safe)."""

    def __init__(self, fs: Any, path: str) -> None:
        self._fs = fs
        self._path = path
        self.name = fs.unstrip_protocol(path)
        try:
            self.size = int(fs.size(path))
        except OSError as exc:
            raise SourceError(f"cannot open: {exc}", self.name) from exc

    def read(self, offset: int, length: int) -> bytes:
        _check_range(self.name, self.size, offset, length)
        if length == 0:
            return b""
        try:
            data = self._fs.cat_file(self._path, start=offset, end=offset + length)
        except OSError as exc:
            raise SourceError(f"read failed at offset {offset}: {exc}", self.name) from exc
        if len(data) != length:
            raise SourceError(f"short read: {len(data)} of {length} bytes at offset {offset}", self.name)
        return data

    def fileno(self) -> int | None:
        return None

    def stat(self) -> SourceStat | None:
        return None

    def reopen(self) -> None:
        """Nothing to do: every read is its own request."""

    def close(self) -> None:
        """Nothing to do: the file system that holds the file owns it."""


class FileObjectSource:
    """An open binary file object (``seek`` and ``read``); reads take a lock, as they share its position."""

    def __init__(self, file: Any, name: str | None = None) -> None:
        self._file = file
        self._lock = threading.Lock()
        self.name = name or str(getattr(file, "path", None) or getattr(file, "name", None) or repr(file))
        try:
            self.size = int(file.seek(0, io.SEEK_END))
        except (OSError, ValueError) as exc:
            raise SourceError(f"cannot seek to the end: {exc}", self.name) from exc

    def read(self, offset: int, length: int) -> bytes:
        _check_range(self.name, self.size, offset, length)
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


def _check_range(name: str, size: int, offset: int, length: int) -> None:
    if offset < 0 or length < 0 or offset + length > size:
        raise SourceError(f"read of {length} bytes at offset {offset} is outside the file ({size} bytes)", name)
