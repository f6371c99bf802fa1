"""An on-disk cache of remote objects' blocks (``--cache-dir``): a second mount of an unchanged object reads
its bytes from local disk instead of the network.

One folder per object version, named by a hash of the object's public URL (never a credential), size, ETag and
S3 version id, so bytes of another version are never served; an object whose answers carry neither a strong
ETag nor a version id is not cached. Each block (``UNIT`` bytes, aligned; the object's last block may be
shorter) is one file: a header with its length and CRC-32, then its bytes, written to a temporary file and
renamed into place, so two mounts sharing the folder never see a torn block, and a block whose check fails
(a crash, a disk error, an edit) is deleted and fetched again. The folder is bounded: past its capacity the
least recently used blocks (file mtimes, touched on every hit) of every object are deleted, and an object's
folder that an eviction empties is removed with them.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import struct
import tempfile
import time
import zlib
from pathlib import Path

from ckptfs.cache_dir import cache_folder
from ckptfs.sources.remote.options import DiskCacheSetting

__all__ = ["DiskBlocks", "DiskCacheSetting", "UNIT", "object_identity"]

UNIT = 1 << 20
"""Bytes of a block on disk: with a disk cache, fetches start and end on these boundaries."""
HEADER = struct.Struct("<8sQI")
MAGIC = b"ckptfsB1"
EVICT_TO = 0.9
"""An eviction frees room down to this fraction of the capacity, so that it runs once per many blocks written."""
STALE_TEMP_SECONDS = 600
"""A temporary file this old is a crashed writer's: the next eviction scan deletes it."""
log = logging.getLogger("ckptfs.sources.remote")


def object_identity(name: str, size: int, etag: str | None, version_id: str | None) -> str | None:
    """What names one version of an object, or None when its answers cannot tell versions apart."""
    strong_etag = etag if etag and not etag.startswith("W/") else None
    if strong_etag is None and not version_id:
        return None
    return f"{name}\n{size}\n{strong_etag or ''}\n{version_id or ''}"


class DiskBlocks:
    """The blocks of one object version in the cache's ``blocks/`` folder, bounded as ``setting`` says for the
    whole folder."""

    def __init__(self, setting: DiskCacheSetting, identity: str, size: int) -> None:
        self.folder = cache_folder(setting.folder, "blocks")
        self.capacity = setting.capacity
        self.size = size
        self._dir = self.folder / hashlib.sha256(identity.encode()).hexdigest()[:40]
        self._used: int | None = None
        """Bytes of the whole folder as of the last scan plus what this process wrote since."""

    def unit_range(self, index: int) -> tuple[int, int]:
        return index * UNIT, min(self.size, (index + 1) * UNIT)

    def load(self, index: int) -> bytes | None:
        """Block ``index`` if a whole, checked copy is on disk; a damaged one is deleted."""
        path = self._dir / str(index)
        try:
            with open(path, "rb") as file:
                data = file.read(HEADER.size + UNIT + 1)
        except OSError:
            return None
        start, end = self.unit_range(index)
        if len(data) >= HEADER.size:
            magic, length, crc = HEADER.unpack_from(data)
            body = data[HEADER.size:]
            if magic == MAGIC and length == end - start == len(body) and zlib.crc32(body) == crc:
                try:
                    os.utime(path)
                except OSError:
                    pass  # evicted by another mount meanwhile: the bytes read are whole all the same
                return body
        log.warning("%s: discarded a damaged cached block %s", self._dir.name, path)
        try:
            path.unlink()
        except OSError:
            pass
        return None

    def store(self, index: int, data: bytes | bytearray | memoryview) -> None:
        """Writes block ``index`` (its whole bytes); a failure to write is logged, never a read's error."""
        try:
            handle, temp = self._temporary()
            try:
                with os.fdopen(handle, "wb") as file:
                    file.write(HEADER.pack(MAGIC, len(data), zlib.crc32(data)))
                    file.write(data)
                os.replace(temp, self._dir / str(index))
            except BaseException:
                os.unlink(temp)
                raise
        except OSError as exc:
            log.warning("%s: cannot cache a block on disk: %s", self.folder, exc.strerror or exc)
            return
        if self._used is None:
            self._used = self._scan_total()
        self._used += HEADER.size + len(data)
        if self._used > self.capacity:
            self._evict()

    def _temporary(self) -> tuple[int, str]:
        """A new temporary file in the object's folder, made first if needed."""
        for _ in range(3):
            self._dir.mkdir(mode=0o700, exist_ok=True)
            try:
                return tempfile.mkstemp(prefix=".tmp-", dir=self._dir)
            except FileNotFoundError:
                continue  # another mount's eviction removed the folder, emptied, between the two calls
        return tempfile.mkstemp(prefix=".tmp-", dir=self._dir)

    def _files(self) -> list[tuple[int, int, str]]:
        """(mtime_ns, size, path) of every block file in the folder; stale temporary files are deleted."""
        files = []
        now = time.time()
        for entry in _scandir(self.folder):
            if not entry.is_dir(follow_symlinks=False):
                continue
            for block in _scandir(Path(entry.path)):
                try:
                    info = block.stat(follow_symlinks=False)
                except OSError:
                    continue
                if block.name.startswith(".tmp-"):
                    if now - info.st_mtime > STALE_TEMP_SECONDS:
                        _unlink(block.path)
                    continue
                files.append((info.st_mtime_ns, info.st_size, block.path))
        return files

    def _scan_total(self) -> int:
        return sum(size for _, size, _ in self._files())

    def _evict(self) -> None:
        files = sorted(self._files())
        total = sum(size for _, size, _ in files)
        goal = int(self.capacity * EVICT_TO)
        emptied = set()
        for _, size, path in files:
            if total <= goal:
                break
            _unlink(path)
            emptied.add(os.path.dirname(path))
            total -= size
        for folder in emptied:
            with contextlib.suppress(OSError):  # not empty: blocks are left, or another mount is writing one
                os.rmdir(folder)
        self._used = total


def _scandir(path: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as entries:
            return list(entries)
    except OSError:
        return []


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass  # another mount evicted it first
