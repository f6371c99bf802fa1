"""A directory as a set of named byte sources, each file opened on first use.

A checkpoint made of several files (a torch.distributed.checkpoint directory)
reads its members through ``SourceSet``: ``open`` gives a member's ``ByteSource``,
``names`` lists them with their sizes. A URL prefix (``s3://b/step/``,
``sources.prefix``) offers the same interface; format code never calls ``os``
itself.
"""

from __future__ import annotations

import os
import stat
import threading
from typing import Protocol, runtime_checkable

from ckptfs.errors import LimitExceededError, NoSuchObjectError, SourceError
from ckptfs.sources.base import ByteSource, SourceStat
from ckptfs.sources.local import LocalFileSource

MAX_MEMBERS = 1_000_000
"""Regular files of a directory listed; a larger directory is refused rather than listed without bound."""
SPARE_DESCRIPTORS = 256
"""File descriptors left for everything else (the FUSE device, logs, libraries) when every member is open."""


@runtime_checkable
class SourceSet(Protocol):
    """Named byte sources below one name (a local directory, a URL prefix: ``sources.prefix``)."""

    name: str
    size: int
    """Total size of the members, in bytes (of those known: a prefix not listed knows the ones opened)."""
    probe_all: bool
    """Whether every member may be looked at by content (``head``) to find metadata: cheap in a local directory,
    a request each on object storage."""

    def names(self) -> dict[str, int]:
        """Every member's name and size (regular files only, in name order): a listing, which a set may be
        unable to make (an http(s):// prefix: SourceError)."""
        ...

    def member_size(self, member: str) -> int | None:
        """The member's size; None where it is not known before the member is opened (a prefix not listed);
        NoSuchObjectError where the set knows there is no such member."""
        ...

    def open(self, member: str) -> ByteSource:
        """The member's source, opened once and kept; SourceError if there is no such member."""
        ...

    def head(self, member: str, length: int) -> bytes:
        """Up to ``length`` first bytes of the member, which is not kept open (b"" if it cannot be read)."""
        ...


class MemberSet:
    """What every set of members shares as a ``ByteSource`` of no bytes of its own (reads fail), so the layers
    above see one source per checkpoint: its ``reopen`` and ``close`` cover every member opened."""

    name: str
    _open: dict[str, ByteSource]
    _lock: threading.Lock

    def read(self, offset: int, length: int) -> bytes:
        raise SourceError("a directory has no bytes of its own: read its files", self.name)

    def fileno(self) -> int | None:
        return None

    def reopen(self) -> None:
        for source in list(self._open.values()):
            source.reopen()

    def close(self) -> None:
        with self._lock:
            opened, self._open = self._open, {}
        for source in opened.values():
            source.close()


class DirectorySource(MemberSet):
    """A local directory's regular files (not its subdirectories), opened lazily with ``LocalFileSource``."""

    probe_all = True

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.name = os.fspath(path)
        try:
            st = os.stat(self.name)
        except OSError as exc:
            raise SourceError(f"cannot stat: {exc.strerror}", self.name) from exc
        if not stat.S_ISDIR(st.st_mode):
            raise SourceError("not a directory", self.name)
        self._stat = SourceStat.of(st)
        self._members = _list_members(self.name)
        self.size = sum(self._members.values())
        _allow_descriptors(len(self._members) + SPARE_DESCRIPTORS)
        self._open: dict[str, ByteSource] = {}
        self._lock = threading.Lock()

    def names(self) -> dict[str, int]:
        return self._members

    def member_size(self, member: str) -> int | None:
        size = self._members.get(member)
        if size is None:
            raise NoSuchObjectError(f"no file {member!r} in the directory", self.name)
        return size

    def open(self, member: str) -> ByteSource:
        source = self._open.get(member)
        if source is not None:
            return source
        if member not in self._members:
            raise SourceError(f"no file {member!r} in the directory", self.name)
        with self._lock:
            source = self._open.get(member)
            if source is None:
                source = LocalFileSource(os.path.join(self.name, member))
                if source.size != self._members[member]:
                    source.close()
                    raise SourceError(f"file {member!r} changed size while being opened", self.name)
                self._open[member] = source
        return source

    def head(self, member: str, length: int) -> bytes:
        opened = self._open.get(member)
        if opened is not None:
            return opened.read(0, min(length, opened.size))
        try:
            source = LocalFileSource(os.path.join(self.name, member))
        except SourceError:
            return b""
        try:
            return source.read(0, min(length, source.size))
        except SourceError:
            return b""
        finally:
            source.close()

    def stat(self) -> SourceStat:
        return self._stat


def _allow_descriptors(count: int) -> None:
    """Raises the soft limit on open files towards ``count`` (at most to the hard limit): every member read stays
    open (its descriptor serves zero-copy reads), and a checkpoint of thousands of ranks has thousands of files."""
    try:
        import resource
    except ImportError:  # not a Unix
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = count if hard == resource.RLIM_INFINITY else min(count, hard)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError):
            pass


def _list_members(path: str) -> dict[str, int]:
    members: dict[str, int] = {}
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                try:
                    if not entry.is_file(follow_symlinks=True):
                        continue
                    size = entry.stat(follow_symlinks=True).st_size
                except OSError:
                    continue
                if len(members) >= MAX_MEMBERS:
                    raise LimitExceededError(f"more than {MAX_MEMBERS} files in the directory", path)
                members[entry.name] = size
    except OSError as exc:
        raise SourceError(f"cannot list: {exc.strerror}", path) from exc
    return dict(sorted(members.items()))
