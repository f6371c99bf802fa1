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
from collections import OrderedDict
from typing import Protocol, runtime_checkable

from ckptfs.errors import LimitExceededError, NoSuchObjectError, SourceError
from ckptfs.sources.base import ByteSource, SourceStat
from ckptfs.sources.local import LocalFileSource

MAX_MEMBERS = 1_000_000
"""Regular files of a directory listed; a larger directory is refused rather than listed without bound."""
SPARE_DESCRIPTORS = 256
"""File descriptors left for everything else (the FUSE device, logs, libraries) when every member is open."""
MAX_OPEN_MEMBERS = 1024
"""Members held open at once. A directory of more files reads them through proxies that reopen a member on
demand, the least recently read one being closed; a directory of at most this many keeps each one open."""
MIN_OPEN_MEMBERS = 16
"""Members held open at once even when the limit on open files leaves fewer than ``SPARE_DESCRIPTORS`` spare."""


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
    """A local directory's regular files (not its subdirectories), opened lazily with ``LocalFileSource``; at
    most ``max_open`` members (fewer if the limit on open files is lower) are open at once."""

    probe_all = True

    def __init__(self, path: str | os.PathLike[str], max_open: int | None = None) -> None:
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
        wanted = MAX_OPEN_MEMBERS if max_open is None else max(1, max_open)
        allowed = _allow_descriptors(min(len(self._members), wanted) + SPARE_DESCRIPTORS)
        self.max_open = min(wanted, max(MIN_OPEN_MEMBERS, allowed - SPARE_DESCRIPTORS))
        self._bounded = len(self._members) > self.max_open
        """Whether members get closed again: then each is read through a ``_Member`` proxy without a fileno,
        since a descriptor handed out (to a zero-copy reply) could be closed and reused under it."""
        self._open: OrderedDict[str, _Opened] = OrderedDict()
        """Open members, least recently read first."""
        self._proxies: dict[str, _Member] = {}
        self._lock = threading.Lock()

    def names(self) -> dict[str, int]:
        return self._members

    def member_size(self, member: str) -> int | None:
        size = self._members.get(member)
        if size is None:
            raise NoSuchObjectError(f"no file {member!r} in the directory", self.name)
        return size

    def open(self, member: str) -> ByteSource:
        if member not in self._members:
            raise SourceError(f"no file {member!r} in the directory", self.name)
        if not self._bounded:
            return self._acquire(member, in_use=False).source
        with self._lock:
            proxy = self._proxies.get(member)
            if proxy is None:
                proxy = self._proxies[member] = _Member(self, member)
        proxy.read(0, 0)  # opened now, so that a missing or changed file fails here, not on a later read
        return proxy

    def open_count(self) -> int:
        """Members open now (at most ``max_open``, plus those being read by other threads at the moment)."""
        return len(self._open)

    def _acquire(self, member: str, in_use: bool = True) -> _Opened:
        with self._lock:
            opened = self._open.get(member)
            if opened is not None:
                self._open.move_to_end(member)
                opened.users += in_use
                return opened
        source = LocalFileSource(os.path.join(self.name, member))
        if source.size != self._members[member]:
            source.close()
            raise SourceError(f"file {member!r} changed size while being opened", self.name)
        with self._lock:
            opened = self._open.get(member)
            if opened is None:
                opened = self._open[member] = _Opened(source)
                self._evict()
            else:
                source.close()  # another thread opened it meanwhile
            self._open.move_to_end(member)
            opened.users += in_use
            return opened

    def _evict(self) -> None:
        """Closes the least recently read members past ``max_open`` (one being read closes when its read ends)."""
        while len(self._open) > self.max_open:
            _, oldest = self._open.popitem(last=False)
            oldest.evicted = True
            if not oldest.users:
                oldest.source.close()

    def _read(self, member: str, offset: int, length: int) -> bytes:
        opened = self._acquire(member)
        try:
            return opened.source.read(offset, length)
        finally:
            with self._lock:
                opened.users -= 1
                if opened.evicted and not opened.users:
                    opened.source.close()

    def head(self, member: str, length: int) -> bytes:
        opened = self._open.get(member)
        if opened is not None and not self._bounded:
            return opened.source.read(0, min(length, opened.source.size))
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

    def reopen(self) -> None:
        for opened in list(self._open.values()):
            opened.source.reopen()

    def close(self) -> None:
        with self._lock:
            opened, self._open = self._open, OrderedDict()
        for entry in opened.values():
            entry.source.close()


class _Opened:
    """An open member, and how many reads are using its descriptor now."""

    __slots__ = ("source", "users", "evicted")

    def __init__(self, source: LocalFileSource) -> None:
        self.source = source
        self.users = 0
        self.evicted = False


class _Member:
    """A member of a directory of more files than may stay open: each read reopens it if it was closed."""

    def __init__(self, directory: DirectorySource, member: str) -> None:
        self._directory = directory
        self._member = member
        self.name = os.path.join(directory.name, member)
        self.size = directory.names()[member]

    def read(self, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise SourceError(f"read of {length} bytes at offset {offset} is outside the file ({self.size} bytes)",
                              self.name)
        return self._directory._read(self._member, offset, length)

    def fileno(self) -> int | None:
        return None

    def stat(self) -> SourceStat | None:
        return self._directory.stat()

    def reopen(self) -> None:
        """Nothing to do: the directory reopens what it holds."""

    def close(self) -> None:
        """Nothing to do: the directory closes its members."""


def _allow_descriptors(count: int) -> int:
    """Raises the soft limit on open files towards ``count`` (at most to the hard limit), so that up to
    ``max_open`` members can stay open (their descriptors serve zero-copy reads); returns the soft limit."""
    try:
        import resource
    except ImportError:  # not a Unix
        return count
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = count if hard == resource.RLIM_INFINITY else min(count, hard)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass
    return count if soft == resource.RLIM_INFINITY else soft


def _list_members(path: str) -> dict[str, int]:
    """The regular files of the directory, with their sizes; a symbolic link counts when it leads to a regular
    file of the directory itself (a link out of it is left out: no metadata makes ckptfs read other files)."""
    members: dict[str, int] = {}
    root = os.path.realpath(path)
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                try:
                    if not entry.is_file(follow_symlinks=True):
                        continue
                    if entry.is_symlink() and os.path.dirname(os.path.realpath(entry.path)) != root:
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
