"""The metadata cache's folder: one file per key, written atomically, bounded in total size (least recently
used entries go first), readable only by its owner.

Two processes may write the same entry at once: each writes its own temporary file and renames it over the
entry, so a reader sees one whole entry or none. An entry that is unreadable, or does not check, is removed.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from ckptfs.cache.entry_key import key_digest
from ckptfs.cache_dir import cache_folder

FOLDER = "metadata"
SUFFIX = ".ckm"
TEMP_PREFIX = ".tmp-"
DEFAULT_MAX_BYTES = 1 << 30
"""Total size the folder's entries are trimmed to after each write."""
MAX_ENTRY_BYTES = 512 << 20
"""An entry larger than this is neither written nor read."""
STALE_TEMP_SECONDS = 3600
"""A temporary file this old is a writer's that died; trimming removes it."""


class MetadataStore:
    def __init__(self, cache_dir: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.folder = cache_folder(cache_dir, FOLDER)
        self.max_bytes = max_bytes

    def path(self, key: str) -> Path:
        return self.folder / (key_digest(key).hex()[:40] + SUFFIX)

    def read(self, key: str) -> bytes | None:
        """The entry's bytes, or None; a hit marks the entry used (its modification time)."""
        path = self.path(key)
        try:
            with open(path, "rb") as file:
                size = os.fstat(file.fileno()).st_size
                if size > MAX_ENTRY_BYTES:
                    raise OSError("entry too large")
                data = file.read(size + 1)
        except FileNotFoundError:
            return None
        except OSError:
            self.discard(key)
            return None
        with contextlib.suppress(OSError):
            os.utime(path)
        return data

    def write(self, key: str, data: bytes) -> None:
        if len(data) > MAX_ENTRY_BYTES or len(data) > self.max_bytes:
            return
        import tempfile  # here: only a write needs it, and a start that finds no entry does without it

        fd, temp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=self.folder)  # mode 0600
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(data)
            os.replace(temp, self.path(key))
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            return
        self.trim()

    def discard(self, key: str) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.path(key))

    def trim(self) -> None:
        """Removes the least recently used entries until the rest fit ``max_bytes``, and stale temporaries."""
        entries = []
        now = time.time()
        with contextlib.suppress(OSError), os.scandir(self.folder) as it:
            for item in it:
                with contextlib.suppress(OSError):
                    info = item.stat(follow_symlinks=False)
                    if item.name.startswith(TEMP_PREFIX) and now - info.st_mtime > STALE_TEMP_SECONDS:
                        os.unlink(item.path)
                    elif item.name.endswith(SUFFIX):
                        entries.append((info.st_mtime_ns, info.st_size, item.path))
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            with contextlib.suppress(OSError):
                os.unlink(path)
            total -= size
