"""``PrefixSet``: the objects below a URL prefix (``s3://bucket/step1000/``, ``https://host/run/step1000/``,
``gs://bucket/step1000/``) as a ``SourceSet``, for a torch.distributed.checkpoint directory on object storage.

Each member is opened by its own URL on first use, the way any object is opened (a suffix GET that pins its
version), and kept. Nothing is listed unless asked: a ``.metadata`` names every file the checkpoint reads, so a
directory saved with collectives mounts without a listing. Per-rank metadata (``use_collectives=False``) needs
``names()``: S3's ListObjectsV2, fsspec's ``ls``; an http(s):// server has no listing (``lister`` None).
"""

from __future__ import annotations

import stat
import threading
from typing import Callable

from ckptfs.errors import LimitExceededError, NoSuchObjectError, SourceError
from ckptfs.sources.base import ByteSource, SourceStat
from ckptfs.sources.directory import MemberSet

MAX_MEMBERS = 1_000_000
"""Objects of a listing kept; a larger prefix is refused rather than listed without bound (as a directory)."""
Lister = Callable[[], dict[str, int]]
"""Every object directly below the prefix: its name (relative to the prefix) and size."""


class PrefixSet(MemberSet):
    """Objects below ``name`` (a URL ending in ``/``); ``open_member`` opens one by its name; ``lister`` lists
    them, None where the store cannot (``cannot_list`` then says why, in the error)."""

    probe_all = False
    """Only names ending in ``.metadata`` are looked at by content for per-rank metadata: each look is a request."""

    def __init__(self, name: str, open_member: Callable[[str], ByteSource], lister: Lister | None,
                 cannot_list: str = "") -> None:
        self.name = name
        self._open_member = open_member
        self._lister = lister
        self._cannot_list = cannot_list
        self._listed: dict[str, int] | None = None
        self._open: dict[str, ByteSource] = {}
        self._lock = threading.Lock()

    @property
    def size(self) -> int:
        """The members' total size: every listed member's, else those opened so far."""
        known = self._listed if self._listed is not None else {n: s.size for n, s in list(self._open.items())}
        return sum(known.values())

    def names(self) -> dict[str, int]:
        if self._listed is None:
            if self._lister is None:
                raise SourceError(f"cannot list the objects below the prefix: {self._cannot_list}", self.name)
            listed = self._lister()
            if len(listed) > MAX_MEMBERS:
                raise LimitExceededError(f"more than {MAX_MEMBERS} objects below the prefix", self.name)
            self._listed = dict(sorted(listed.items()))
        return self._listed

    def member_size(self, member: str) -> int | None:
        """The member's size if known without a request (listed or opened), else None (checked when it is read);
        NoSuchObjectError if the listing has no such member."""
        opened = self._open.get(member)
        if opened is not None:
            return opened.size
        if self._listed is None:
            return None
        if member not in self._listed:
            raise NoSuchObjectError(f"no object {member!r} below the prefix", self.name)
        return self._listed[member]

    def open(self, member: str) -> ByteSource:
        source = self._open.get(member)
        if source is not None:
            return source
        if not is_member_name(member):
            raise SourceError(f"{member!r} is not the name of an object directly below the prefix", self.name)
        if self._listed is not None and member not in self._listed:
            raise NoSuchObjectError(f"no object {member!r} below the prefix", self.name)
        with self._lock:
            source = self._open.get(member)
            if source is None:
                source = self._open_member(member)
                self._open[member] = source
        return source

    def head(self, member: str, length: int) -> bytes:
        """The member's first bytes; it is kept open (its opening request is the cost of a look)."""
        try:
            source = self.open(member)
            return source.read(0, min(length, source.size))
        except SourceError:
            return b""

    def exists(self) -> bool:
        """Whether anything is below the prefix: a ``.metadata``, else (where the store lists) any object."""
        try:
            self.open(".metadata")
            return True
        except NoSuchObjectError:
            pass
        if self._lister is None:
            return False
        return bool(self.names())

    def stat(self) -> SourceStat:
        """A read-only directory, modified when its ``.metadata`` was (the first member opened otherwise)."""
        opened = list(self._open.values())
        first = self._open.get(".metadata") or (opened[0] if opened else None)
        member = first.stat() if first is not None else None
        return SourceStat.read_only(self.size, member.mtime_ns if member else 0, stat.S_IFDIR | 0o555)


def is_member_name(member: str) -> bool:
    """A name directly below a prefix: no separator, no parent, nothing a URL would read as its query."""
    return bool(member) and member not in (".", "..") and not any(c in member for c in "/\\?#\x00")
