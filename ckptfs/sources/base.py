"""What every byte source offers: a size, positioned reads, the file's attributes."""

from __future__ import annotations

import os
import stat
from typing import Iterable, NamedTuple, Protocol


class SourceStat(NamedTuple):
    """The attributes a mount shows for its files: owner, permission bits and times of the source."""

    size: int
    mode: int
    uid: int
    gid: int
    atime_ns: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> SourceStat:
        return cls(st.st_size, st.st_mode, st.st_uid, st.st_gid, st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns)

    @classmethod
    def read_only(cls, size: int, mtime_ns: int, mode: int = stat.S_IFREG | 0o444) -> SourceStat:
        """A source with no owner of its own (an object in a store): this process's, read-only, every time the
        object's modification time."""
        return cls(size, mode, os.getuid(), os.getgid(), mtime_ns, mtime_ns, mtime_ns)


class ByteSource(Protocol):
    name: str
    size: int

    def read(self, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes at ``offset``; raises SourceError when short."""
        ...

    def fileno(self) -> int | None:
        """A file descriptor holding these bytes at the same offsets, for zero-copy reads, or None."""
        ...

    def stat(self) -> SourceStat | None:
        """The source's attributes, or None where it has none (bytes in memory)."""
        ...

    def reopen(self) -> None:
        """Called in a process forked after opening: re-creates what a child cannot share (network sessions)."""
        ...

    def close(self) -> None: ...


TAIL_HINT = "tail_hint"
"""Optional attribute of a source: how many bytes at its end one read fetches as cheaply as a few (a remote
source's suffix request at open holds them). Opening a checkpoint reads at least that much of the tail first."""


def tail_hint(source: ByteSource) -> int:
    """The source's ``tail_hint``, 0 when it declares none (any read is cheap: a local file)."""
    hint = getattr(source, TAIL_HINT, 0)
    return hint if type(hint) is int and hint > 0 else 0


SET_EXTENTS = "set_extents"
"""Optional method of a source, ``set_extents([(start, end), ...])``: where the checkpoint's storages lie in it,
told once parsed. A remote source sizes its read-ahead by them (never far past the storage being read); the
layers above know tensors, sources know only bytes, so the hint goes down this way."""


def hint_extents(source: ByteSource, extents: Iterable[tuple[int, int]]) -> None:
    """Tells ``source`` where its storages lie, if it takes the hint (``extents`` is not iterated otherwise:
    a local mount of 20,000 tensors does not pay for it)."""
    method = getattr(source, SET_EXTENTS, None)
    if callable(method):
        method(list(extents))


BUFFERS = "buffers"
"""Optional method of a source, ``buffers(offset, length) -> (buffers, leased)``, with ``release(leased)``: the
bytes ``read`` would return as a reply's buffers, ``(fd, pos, size)`` ranges of a file the source keeps as it is
until ``release`` (a remote source's memfd blocks, ``sources.remote.blocks``) and bytes for the rest. A mount
answers with them as it answers from a local file's descriptor: the bytes never pass through Python."""


IDENTITY = "identity"
"""Optional attribute of a source: a string naming the exact version of its bytes (a remote object's URL, size
and ETag or version id), or None where its store names none. The metadata cache keys remote entries by it."""


def version_identity(source: ByteSource) -> str | None:
    """The source's ``identity``, None when it declares none."""
    identity = getattr(source, IDENTITY, None)
    return identity if type(identity) is str and identity else None
