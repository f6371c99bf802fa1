"""The FUSE callbacks of a mount: attributes, listings and reads of a ``Layout``, through mfusepy on libfuse3 (an
``-o rw`` mount: ``fuse.writable``) or, by inode number, on its low-level API (a read-only one: ``fuse.inodes``).

Importing this module loads libfuse3 (``MountError`` if it is missing).

Hot paths skip mfusepy's generic conversions: ``getattr`` fills the C ``struct stat`` directly, ``readdir`` hands
the kernel every entry's attributes (readdirplus), written a window of entries at a time from sizes kept per
directory, and ``read_buf`` answers a read of a tensor stored as one little-endian range with a buffer naming the
source's file descriptor and absolute offset (a remote source's: the memfd its fetched blocks are in,
``sources.base.BUFFERS``), so libfuse reads the bytes itself and they never pass through Python. Everything else
(strided or byte-swapped tensors, deflated records, generated files) is read into memory and handed over the same way.
"""

from __future__ import annotations

import array
import ctypes
import errno
import itertools
import logging
import os
import stat
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, NoReturn

from ckptfs.checkpoint import Checkpoint
from ckptfs.errors import CkptfsError, ObjectChangedError
from ckptfs.fs.layout import Layout
from ckptfs.fs.nodes import Dir, Kind, Node
from ckptfs.fs.pieces import Content, Literal, Part, SourceBytes, part_bytes
from ckptfs.fuse import bindings as libfuse
from ckptfs.fuse.dirents import Column, Names, blocks, numpy_loaded, write_column
from ckptfs.fuse.opened import OpenFile, check_not_truncated
from ckptfs.sources import BUFFERS, SourceStat

mfusepy = libfuse.load_mfusepy()

log = logging.getLogger("ckptfs.fuse.mount")

MAX_REQUEST = 1 << 20
"""Largest write request libfuse3 and the kernel exchange (reads: ``bindings.MAX_READ``)."""
BLOCK_SIZE = 1 << 20
"""``st_blksize``: tools size their reads by it."""
CACHE_TIMEOUT = 86400.0
"""Entry, attribute and negative-lookup timeouts: the source is treated as immutable while mounted."""
STATFS_BLOCK = 4096
UNKNOWN_SIZE = 1
"""What a file whose size cannot be computed lists: not 0, or its reads would end at the kernel (no open reaches
``open``, see ``fuse.inodes``) instead of failing with EIO here."""
MAX_FILE_SIZE = (1 << 63) - 1
"""Largest size a file can have (``loff_t``): a longer tensor (a stride-0 one can be) shows its first bytes."""
MAX_LISTED_ENTRIES = 1 << 22
"""Directory entries whose sizes are kept for listings (4 bytes each, 8 where one is 4 GiB or more); past it they are
made again as asked."""
KEPT_LISTING = 256
"""Listings of fewer entries are made again as listed, not kept: a ``--nest`` tree's ~69,000 would keep ~22 MiB."""
WINDOW = 1024
"""Entries whose names and ``struct stat``s are made at once for readdir, kept for the requests that follow (a
kernel request takes ~20 with attributes)."""
SIZES_WINDOW = 4096
"""Entries made at once to compute a listing's sizes."""
_MAX_NARROW_SIZE = (1 << 32) - 1
"""The largest size a listing's sizes keep in 4 bytes (``array`` typecode ``I``)."""

_STAT = mfusepy.c_stat
_STAT_SIZE = ctypes.sizeof(_STAT)
_VOIDP = ctypes.c_void_p
_FuseOSError = mfusepy.FuseOSError
_RawFiller = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int64,
                              ctypes.c_int)
"""libfuse's ``fuse_fill_dir_t`` taking the ``struct stat`` as a plain address."""


@dataclass(slots=True)
class _Listing:
    directory: Dir
    sizes: array.array[int]
    """The file size of each entry (``.``, ``..``, then the directory's), made once."""


@dataclass(slots=True)
class _Window:
    """Consecutive entries of one listing ready for the kernel."""

    directory: Dir
    start: int
    names: Names
    memory: bytearray
    """Their ``struct stat``s, one after another."""
    address: int
    """Where ``memory`` is."""


class CheckpointFS:
    """Callbacks for mfusepy; it installs the ones this object has (raw C arguments where noted)."""

    use_ns = True

    def __init__(self, checkpoint: Checkpoint, layout: Layout, on_init: Callable[[], None] | None = None, *,
                 uid: int | None = None, gid: int | None = None, umask: int | None = None) -> None:
        """``uid``, ``gid``: every entry's owner (default: the source file's); ``umask``: bits taken from 0555
        (directories) and 0444 (files) (default: the source file's read bits, directories searchable where readable).
        """
        self.checkpoint = checkpoint
        self.layout = layout
        self._on_init = on_init
        self.initialized = False
        self._files: dict[int, OpenFile] = {}
        self._listings: dict[int, _Listing] = {}
        self._window: _Window | None = None
        self._listed = 0
        self._handles = itertools.count(1)
        self._leases: dict[int, list[tuple[Any, list[Any]]]] = {}
        """By FUSE thread: the sources' blocks its last reply is sent from (``sources.base.BUFFERS``)."""
        source = checkpoint.source.stat()
        self._source_size = checkpoint.source.size
        self._template = self._stat_template(source, uid, gid)
        readable = (source.mode if source else 0o444) & 0o444
        searchable = readable >> 2
        if umask is not None:
            readable, searchable = 0o444 & ~umask, 0o111 & ~umask
        link_mode, dir_mode = stat.S_IFLNK | 0o777, stat.S_IFDIR | readable | searchable
        self._modes = {kind: dir_mode if kind is Kind.DIR else
                       link_mode if kind is Kind.LINK or kind is Kind.VIEW_LINK else stat.S_IFREG | readable
                       for kind in Kind}
        """``st_mode`` by kind of entry."""

    @staticmethod
    def _stat_template(source: SourceStat | None, uid: int | None, gid: int | None) -> bytes:
        """What every entry shares: one link, owner (the source file's by default) and times of the source file,
        block size."""
        st = _STAT()
        st.st_nlink = 1
        st.st_uid = uid if uid is not None else source.uid if source else os.getuid()
        st.st_gid = gid if gid is not None else source.gid if source else os.getgid()
        st.st_blksize = BLOCK_SIZE
        if source:
            st.st_atimespec.tv_sec, st.st_atimespec.tv_nsec = divmod(source.atime_ns, 10**9)
            st.st_mtimespec.tv_sec, st.st_mtimespec.tv_nsec = divmod(source.mtime_ns, 10**9)
            st.st_ctimespec.tv_sec, st.st_ctimespec.tv_nsec = divmod(source.ctime_ns, 10**9)
        return bytes(st)

    # -- attributes and listings (raw C arguments, see CheckpointFUSE) ------------

    def _fill(self, st: Any, node: Node) -> None:
        """The entry's own attributes into a ``struct stat`` that already holds the template."""
        st.st_ino = node.ino
        st.st_mode = self._modes[node.kind]
        size = self._size(node)
        st.st_size = size
        st.st_blocks = (size + 511) >> 9

    def _size(self, node: Node) -> int:
        """The node's file size, at most ``MAX_FILE_SIZE``; ``UNKNOWN_SIZE`` (logged) when it cannot be computed,
        so that its listing still lists."""
        if node.size >= 0:
            return min(node.size, MAX_FILE_SIZE)
        try:
            return min(self.layout.size(node), MAX_FILE_SIZE)
        except Exception:
            log.exception("%s: cannot compute its size", self.layout.path_of(node))
            return UNKNOWN_SIZE

    def _node(self, path: bytes) -> Node | None:
        return self.layout.lookup(path.decode("utf-8", "surrogateescape"))

    def getattr(self, path: bytes, buf: Any) -> int:
        node = self._node(path)
        if node is None:
            return -errno.ENOENT
        ctypes.memmove(buf, self._template, _STAT_SIZE)
        self._fill(buf.contents, node)
        return 0

    def readdir(self, path: bytes, buf: int, filler: Any, offset: int, flags: int) -> int:
        """Entries from ``offset`` on, each with its attributes; stops when the kernel's buffer is full.

        Entries are made a window at a time (the last one kept: the kernel reads a listing in order, a request
        after another), their ``struct stat``s written a column at a time into one array.
        """
        directory = self._node(path)
        if directory is None:
            return -errno.ENOENT
        if not isinstance(directory, Dir):
            return -errno.ENOTDIR
        plus = libfuse.FUSE_FILL_DIR_PLUS if flags & libfuse.FUSE_READDIR_PLUS else 0
        fill = _RawFiller(ctypes.cast(filler, _VOIDP).value)
        for window, first in self._windows(directory, offset):
            start, names, address = window.start, window.names.names, window.address
            for index in range(first, len(names)):
                if fill(buf, names[index], address + index * _STAT_SIZE, start + index + 1, plus):
                    return 0
        return 0

    def listed_count(self, directory: Dir) -> int:
        """The entries of the directory's listing: ``.``, ``..`` and its own."""
        return 2 + self.layout.listing_length(directory)

    def _windows(self, directory: Dir, position: int) -> Iterator[tuple[_Window, int]]:
        """The windows of a listing from entry ``position`` on, each with the index of its first entry wanted."""
        total = self.listed_count(directory)
        while position < total:
            window = self._window
            if window is None or window.directory is not directory or not (
                    window.start <= position < window.start + window.names.count):
                window = self._make_window(directory, position, self._listing(directory).sizes)
            yield window, position - window.start
            position = window.start + window.names.count

    def _make_window(self, directory: Dir, start: int, sizes: array.array[int]) -> _Window:
        """Entries ``start`` to ``start + WINDOW``: names and ``struct stat``s, kept as the last window made."""
        stop = min(start + WINDOW, len(sizes))
        found = self._arrays(directory, start - 2, stop - 2) if start >= 2 and numpy_loaded() else None
        if found is not None:  # a big directory's window of tensors and their views: columns made with numpy
            names, ino_column, mode_column = found
            memory = self._stats(ino_column, mode_column, sizes[start:stop], bulk=True)
        else:
            dots = [directory, directory.parent or directory][start:stop]
            names, inos, kinds = self.layout.listing_columns(directory, max(start - 2, 0), max(stop - 2, 0))
            names = [".", ".."][start:stop] + names
            modes = self._modes
            memory = self._stats([n.ino for n in dots] + inos, [modes[k] for k in [n.kind for n in dots] + kinds],
                                 sizes[start:stop])
        window = _Window(directory, start, Names(names), memory,
                         ctypes.addressof(ctypes.c_char.from_buffer(memory)))
        self._window = window  # one object replaced whole: a concurrent readdir keeps the one it took
        return window

    def _arrays(self, directory: Dir, start: int, stop: int) -> tuple[list[str], Column, Column] | None:
        """``Dir.listed_arrays`` of entries ``start`` to ``stop`` of the listing, kinds given as modes."""
        self.layout.entries(directory)
        return directory.listed_arrays(start, stop, self.layout.views, self._modes)

    def _stats(self, inos: Column, modes: Column, sizes: array.array[int], bulk: bool = False) -> bytearray:
        """``struct stat``s, one after another: the template repeated, the fields that differ written a column at
        a time."""
        memory = bytearray(self._template * len(inos))
        view = memoryview(memory)
        for field, values in ((_STAT.st_ino, inos), (_STAT.st_mode, modes), (_STAT.st_size, sizes),
                              (_STAT.st_blocks, blocks(sizes, bulk))):
            write_column(view, field.offset, field.size, _STAT_SIZE, values)
        return memory

    def _listing(self, directory: Dir) -> _Listing:
        """The sizes of the directory's entries (``.`` and ``..`` first), kept if there are ``KEPT_LISTING``.

        Listings of big directories come back again and again (``ls``, ``find``,
        every shell completion), and the kernel does not keep them (no
        ``cache_readdir`` through libfuse 3.14's high-level API). Sizes are
        what is costly to make again (a sidecar's needs its text's length);
        entries are made from the directory's plan as they are listed.
        """
        listing = self._listings.get(directory.ino)
        if listing is not None and listing.directory is directory:
            return listing
        sizes = array.array("I", [0, 0])  # 4 bytes an entry until a file of 4 GiB or more is listed
        total = self.layout.listing_length(directory)
        for start in range(0, total, SIZES_WINDOW):
            try:
                found = self.layout.listing_sizes(directory, start, start + SIZES_WINDOW)
            except Exception:  # one entry at a time: those whose size fails list with size 0 (logged)
                found = [self._size(node) for node in self.layout.listing_slice(directory, start, start + SIZES_WINDOW)]
            if max(found, default=0) > _MAX_NARROW_SIZE:
                found = [min(size, MAX_FILE_SIZE) for size in found]
                if sizes.typecode == "I":
                    sizes = array.array("q", sizes)
            sizes.extend(found)
        listing = _Listing(directory, sizes)
        if len(sizes) < KEPT_LISTING:
            return listing
        self._listed += len(sizes)
        if self._listed > MAX_LISTED_ENTRIES:
            self._listings.clear()
            self._listed = len(sizes)
        self._listings[directory.ino] = listing
        return listing

    def readlink(self, path: str) -> str:
        node = self.layout.lookup(path)
        if node is None:
            raise _FuseOSError(errno.ENOENT)
        if node.kind is not Kind.LINK and node.kind is not Kind.VIEW_LINK:
            raise _FuseOSError(errno.EINVAL)
        return self.layout.link_target(node)

    # -- reading -------------------------------------------------------------------

    def open(self, path: str, flags: int) -> int:
        if flags & os.O_ACCMODE != os.O_RDONLY:
            raise _FuseOSError(errno.EROFS)
        node = self.layout.lookup(path)
        if node is None:
            raise _FuseOSError(errno.ENOENT)
        if node.kind is Kind.DIR:
            raise _FuseOSError(errno.EISDIR)
        try:
            opened = self._open(path, node)
        except (CkptfsError, OSError) as exc:
            log.error("%s: %s", path, exc)
            raise _FuseOSError(errno.EIO) from None
        handle = next(self._handles)
        self._files[handle] = opened
        return handle

    def _open(self, path: str, node: Node) -> OpenFile:
        if node.kind is Kind.VALUE:  # its bytes made once, its size theirs (as listed: fs.contents.value_size)
            data = self.layout.content(node)
            return OpenFile(path, Content([Literal(data)], len(data)), data=data)
        content = Content(self.layout.pieces(node), self._size(node))
        first = content.pieces[0] if len(content.pieces) == 1 else None
        if isinstance(first, SourceBytes) and (fd := first.extent.source.fileno()) is not None:
            return OpenFile(path, content, fd=fd, start=first.extent.offset)
        if isinstance(first, Literal) and len(first.data) == content.size:
            return OpenFile(path, content, data=first.data)
        return OpenFile(path, content)

    def read_buf(self, bufpp: int, size: int, offset: int, handle: int, ino: int = 0) -> int:
        """Answers a read with a bufvec stored at address ``bufpp``: an fd range when the tensor is one.

        ``handle`` 0 (no open was made, see ``fuse.inodes``): the file is found by its inode number ``ino``."""
        sent = self._leases.pop(threading.get_ident(), None)
        for source, leased in sent or ():  # this thread's last reply is sent (libfuse sends it before the next read)
            source.release(leased)
        opened = self._files.get(handle) if handle else self._unopened(ino)
        if opened is None:
            return -errno.EBADF if handle else -errno.EIO
        count = min(size, opened.content.size - offset)
        try:
            if count <= 0:
                address = libfuse.bytes_bufvec(b"")
            elif opened.fd >= 0:
                check_not_truncated(opened.fd, opened.start + offset, count)
                address = libfuse.fd_bufvec(opened.fd, opened.start + offset, count)
            elif opened.data is not None:
                address = libfuse.bytes_bufvec(bytes(memoryview(opened.data)[offset : offset + count]))
            else:
                address = libfuse.bufvec(self._buffers(opened.content.cover(offset, count)))
        except Exception as exc:  # one bad read is one EIO and a log line: the daemon serves on
            log.error("%s: read of %d bytes at offset %d: %s", opened.path, count, offset,
                      exc.for_mount() if isinstance(exc, ObjectChangedError) else exc)
            return -errno.EIO
        _VOIDP.from_address(bufpp).value = address
        return 0

    def _unopened(self, ino: int) -> OpenFile | None:
        """The file a read without an open names; none here, where every read comes with its open's handle."""
        return None

    def _buffers(self, parts: list[Part]) -> list[libfuse.FdRange | bytes]:
        """What libfuse sends for these parts: file-descriptor ranges for stored extents, bytes for the rest."""
        buffers: list[libfuse.FdRange | bytes] = []
        for part in parts:
            piece = part.piece
            if isinstance(piece, SourceBytes) and (fd := piece.extent.source.fileno()) is not None:
                check_not_truncated(fd, piece.extent.offset + part.start, part.length)
                buffers.append((fd, piece.extent.offset + part.start, part.length))
            elif isinstance(piece, SourceBytes) and (method := getattr(piece.extent.source, BUFFERS, None)):
                held, leased = method(piece.extent.offset + part.start, part.length)
                if leased:
                    self._leases.setdefault(threading.get_ident(), []).append((piece.extent.source, leased))
                buffers.extend(held)
            else:
                buffers.append(part_bytes(self.checkpoint, part))
        return buffers

    def release(self, path: str, handle: int) -> int:
        self._files.pop(handle, None)
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        return {"f_bsize": STATFS_BLOCK, "f_frsize": STATFS_BLOCK,
                "f_blocks": -(-self._source_size // STATFS_BLOCK), "f_bfree": 0, "f_bavail": 0,
                "f_files": len(self.checkpoint.tensors), "f_ffree": 0, "f_namemax": 255}

    def init_with_config(self, conn: Any, config: Any) -> None:
        config.use_ino = 1
        config.kernel_cache = 1
        config.entry_timeout = config.attr_timeout = config.negative_timeout = CACHE_TIMEOUT
        conn.max_read = conn.max_readahead = libfuse.MAX_READ
        wanted = libfuse.FUSE_CAP_READDIRPLUS | libfuse.FUSE_CAP_CACHE_SYMLINKS | libfuse.FUSE_CAP_SPLICE_WRITE
        # Readdirplus always, not only for a directory's first request: find -ls then needs no lookups.
        conn.want = (conn.want | (conn.capable & wanted)) & ~libfuse.FUSE_CAP_READDIRPLUS_AUTO
        self.initialized = True
        if self._on_init is not None:
            self._on_init()

    def _read_only(self, *args: Any) -> NoReturn:
        raise _FuseOSError(errno.EROFS)

    write = create = mkdir = mknod = unlink = rmdir = symlink = rename = link = _read_only
    chmod = chown = truncate = utimens = setxattr = removexattr = fallocate = _read_only
