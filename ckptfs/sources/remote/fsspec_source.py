"""Any other fsspec URL (gs://, az://, abfs://, hf://, chained URLs ...) through fsspec, when it is installed.

Every read is one ``cat_file`` whose length is checked; the version is not pinned and nothing is cached here
(fsspec's backends have their own caching and retries): the direct sources are the fast, checked path.
"""

from __future__ import annotations

import os
import stat
import threading
from datetime import datetime

from ckptfs.errors import SourceError, UnsupportedError
from ckptfs.sources.base import SourceStat
from ckptfs.sources.remote.options import RemoteOptions, public_name


class FsspecSource:
    def __init__(self, url: str, options: RemoteOptions) -> None:
        self.name = public_name(url)
        self._url = url
        self._storage = options.backend_options()
        self._lock = threading.Lock()
        self._open()
        try:
            info = self._fs.info(self._path)
        except FileNotFoundError:
            raise SourceError("no such object", self.name) from None
        except Exception as exc:  # fsspec backends raise what their libraries raise
            raise SourceError(f"cannot open: {type(exc).__name__}: {exc}", self.name) from None
        if info.get("type") == "directory":
            raise SourceError("a directory, not a checkpoint file", self.name)
        self.size = int(info.get("size") or 0)
        self._mtime_ns = _mtime_ns(info)

    def _open(self) -> None:
        try:
            import fsspec
        except ImportError:
            raise UnsupportedError(f"{self._url.partition('://')[0]}:// needs fsspec (pip install fsspec and the "
                                   "backend for the scheme)", self.name) from None
        try:
            self._fs, self._path = fsspec.core.url_to_fs(self._url, skip_instance_cache=True, **self._storage)
        except (ImportError, ValueError) as exc:
            raise UnsupportedError(f"fsspec cannot open it: {exc}", self.name) from None

    def read(self, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise SourceError(f"read of {length} bytes at offset {offset} is outside the object "
                              f"({self.size} bytes)", self.name)
        if length == 0:
            return b""
        try:
            data = self._fs.cat_file(self._path, start=offset, end=offset + length)
        except Exception as exc:  # fsspec backends raise what their libraries raise
            raise SourceError(f"read of {length} bytes at offset {offset} failed: {type(exc).__name__}: {exc}",
                              self.name) from None
        if len(data) != length:
            raise SourceError(f"read of {length} bytes at offset {offset} returned {len(data)}", self.name)
        return bytes(data)

    def fileno(self) -> int | None:
        return None

    def stat(self) -> SourceStat:
        mtime = self._mtime_ns
        return SourceStat(self.size, stat.S_IFREG | 0o444, os.getuid(), os.getgid(), mtime, mtime, mtime)

    def reopen(self) -> None:
        self._open()

    def close(self) -> None:
        pass


def _mtime_ns(info: dict) -> int:
    for key in ("LastModified", "mtime", "updated", "last_modified", "created"):
        value = info.get(key)
        if isinstance(value, datetime):
            return int(value.timestamp()) * 10**9
        if isinstance(value, (int, float)):
            return int(value) * 10**9
        if isinstance(value, str):
            try:
                return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()) * 10**9
            except ValueError:
                continue
    return 0


def open_fsspec(url: str, options: RemoteOptions) -> FsspecSource:
    return FsspecSource(url, options)
