"""A read-only mount answered by inode number, on libfuse3's low-level API (``fuse.lowlevel``).

libfuse then keeps no node table and no path per entry: every request names
an inode number, and ``Layout.node_at`` finds its node from the number alone
(its container's block, the child's position, the view's slot). Nothing is
kept per number handed to the kernel, so FORGETs free nothing (libfuse answers
them itself). The nodes below ``/.zarr`` have numbers of their own
(``fs.zarr``): those handed out are kept by number, as many as ``/.zarr``'s
directories already hold.

Directories and files need no open (ENOSYS: the kernel's ``no_opendir`` and
``no_open``, which also keep listings and pages cached); reads find their file
by inode number among those kept (``fuse.opened``) and are answered with the
bufvecs ``CheckpointFS.read_buf`` makes (file-descriptor ranges where it can).

Small value files need no READ at all: once the kernel holds a listing's
entries, their bytes are pushed into its page cache (``fuse.page_store``).
Listings store nothing until a value file is first read: a mount only listed
(``ls -l``, ``find -ls``) pays no store; the first read of a value stores what
was listed until then, and listings store from then on.
"""

from __future__ import annotations

import array
import ctypes
import errno
import functools
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable

from ckptfs.errors import CkptfsError
from ckptfs.fs.nodes import Dir, Kind, Node
from ckptfs.fs.zarr import ZARR_INO, ZarrDir
from ckptfs.fuse import bindings as libfuse
from ckptfs.fuse import lowlevel as ll
from ckptfs.fuse.dirents import Column, add_entries, blocks, write_column
from ckptfs.fuse.opened import KeptFiles, OpenFile
from ckptfs.fuse.operations import CACHE_TIMEOUT, CheckpointFS
from ckptfs.fuse.page_store import Batch, PageStore
from ckptfs.gc_pause import gc_paused

log = logging.getLogger("ckptfs.fuse.mount")

ENTRY_SIZE = ctypes.sizeof(ll.FuseEntryParam)
ATTR = ll.FuseEntryParam.attr.offset
_ADDRESS = ctypes.addressof
STORE_FILE_BYTES = 4096
"""Value files up to this size (one page of the kernel's cache each) are stored as their directory is listed."""
STORE_FILES = 1 << 16
"""Files stored per directory at most: a listing of more leaves the rest to be read (a page each: 256 MiB)."""
STORED_FILES = 1 << 18
"""Files stored in a mount at most (a page each: 1 GiB of page cache that listings alone push); then none is."""
STORE_BATCH = 1024
"""Files handed to the storing thread at once: it stores a long listing's first files while the rest are made."""
STORED_DIRECTORIES = 1 << 20
"""Directories whose stored part is remembered (no listing stores a file twice); past it all are forgotten."""


def _answering(method: Callable[..., None]) -> Callable[..., None]:
    """A callback that answers EIO (logged) whatever goes wrong: an unanswered request would hang its caller."""

    @functools.wraps(method)
    def answer(self: InodeFS, req: int, *args: Any) -> None:
        try:
            method(self, req, *args)
        except BaseException:
            log.exception("%s", method.__name__)
            ll.reply_err(req, errno.EIO)

    return answer


class InodeFS(CheckpointFS):
    """``CheckpointFS``'s attributes, listings and reads, as callbacks of libfuse's low-level API."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._kept = KeptFiles()
        """Files of reads, by inode number."""
        self._reply_buffers = threading.local()
        """Each thread's buffer for listing replies (``_reply_buffer``)."""
        self._mirrored: dict[int, Node] = {}
        """The nodes below ``/.zarr`` handed to the kernel, by inode number."""
        self.no_open = self.no_opendir = False
        """Opens of files (directories) answered with ENOSYS, once the kernel has said it takes that (``_init``)."""
        self._operations: ll.LowLevelOps | None = None
        self.handoff: Callable[[], None] = _stay
        """Called before a read that may wait on the network (``OpenFile.may_wait``): the session's loop lets another
        thread receive the next requests meanwhile (``fuse.turns``)."""
        self.remote = self.checkpoint.source.fileno() is None
        """Reads may wait on the source (a remote store's): a file's first read, tensor bytes gathered from it."""
        self._store: PageStore | None = None
        self._stored: dict[int, int] = {}
        """By directory: the listing positions below this have had their value files stored (or passed over)."""
        self._held: dict[int, tuple[Dir, int]] | None = {}
        """Until a value file is read: by directory, the listing positions below this the kernel holds; then None."""
        self._value_read = False
        self._store_budget = STORED_FILES
        """Files still to be stored at most (``STORED_FILES``)."""
        entry = ll.FuseEntryParam(attr_timeout=CACHE_TIMEOUT, entry_timeout=CACHE_TIMEOUT)
        ctypes.memmove(_ADDRESS(entry) + ATTR, self._template, ctypes.sizeof(ll.Stat))
        self._entry = bytes(entry)
        """What every ``fuse_entry_param`` shares: the ``struct stat`` template and the timeouts."""

    def operations(self) -> ll.LowLevelOps:
        """The callbacks, kept on this object as long as it lives (libfuse holds plain pointers to them)."""
        found = self._operations
        if found is None:
            found = self._operations = ll.LowLevelOps(
                init=ll.INIT(self._init), lookup=ll.LOOKUP(self._lookup), getattr=ll.WITH_FILE(self._getattr),
                readlink=ll.BY_INO(self._readlink), open=ll.WITH_FILE(self._open_file),
                opendir=ll.WITH_FILE(self._opendir), read=ll.LISTING(self._read), readdir=ll.LISTING(self._readdir),
                readdirplus=ll.LISTING(self._readdirplus), statfs=ll.BY_INO(self._statfs))
        return found

    @contextmanager
    def storing(self, session: int) -> Iterator[PageStore]:
        """Value files' bytes stored into ``session``'s page cache as listed, while in this context."""
        self._store = store = PageStore(session)
        try:
            yield store
        finally:
            self._store = None
            store.close()

    # -- nodes by number -----------------------------------------------------------

    def at(self, ino: int) -> Node | None:
        if ino >= ZARR_INO:
            return self._mirrored.get(ino)
        return self.layout.node_at(ino)

    def _hand_out(self, node: Node) -> None:
        if node.ino >= ZARR_INO:
            self._mirrored[node.ino] = node

    def _directory(self, req: int, ino: int) -> Dir | None:
        """The directory ``ino``; None, the request answered, if there is none."""
        node = self.at(ino)
        if isinstance(node, Dir):
            return node
        ll.reply_err(req, errno.ENOENT if node is None else errno.ENOTDIR)
        return None

    # -- callbacks -----------------------------------------------------------------

    def _init(self, userdata: int, conn_pointer: Any) -> None:
        conn = conn_pointer.contents
        conn.max_read = conn.max_readahead = libfuse.MAX_READ  # max_read: as the -o max_read given to the session
        wanted = libfuse.FUSE_CAP_READDIRPLUS | libfuse.FUSE_CAP_CACHE_SYMLINKS | libfuse.FUSE_CAP_SPLICE_WRITE
        # Readdirplus always, not only for a directory's first request: find -ls then needs no lookups.
        conn.want = (conn.want | (conn.capable & wanted)) & ~libfuse.FUSE_CAP_READDIRPLUS_AUTO
        # A kernel without no_open (no_opendir) would fail the open answered with ENOSYS: opens are answered then.
        self.no_open = bool(conn.capable & libfuse.FUSE_CAP_NO_OPEN_SUPPORT)
        self.no_opendir = bool(conn.capable & ll.FUSE_CAP_NO_OPENDIR_SUPPORT)
        self.initialized = True
        if self._on_init is not None:
            self._on_init()

    @_answering
    def _lookup(self, req: int, parent: int, name: bytes) -> None:
        directory = self._directory(req, parent)
        if directory is None:
            return
        entry = ll.FuseEntryParam.from_buffer_copy(self._entry)  # inode 0: a negative entry, cached as long
        node = self.layout.entry(directory, name.decode("utf-8", "surrogateescape"))
        if node is not None:
            self._hand_out(node)
            entry.ino = node.ino
            self._fill(entry.attr, node)
        ll.reply_entry(req, _ADDRESS(entry))

    @_answering
    def _getattr(self, req: int, ino: int, fi: int | None) -> None:
        node = self.at(ino)
        if node is None:
            ll.reply_err(req, errno.ENOENT)
            return
        st = ll.Stat.from_buffer_copy(self._template)
        self._fill(st, node)
        ll.reply_attr(req, _ADDRESS(st), CACHE_TIMEOUT)

    @_answering
    def _readlink(self, req: int, ino: int) -> None:
        node = self.at(ino)
        if node is None or (node.kind is not Kind.LINK and node.kind is not Kind.VIEW_LINK):
            ll.reply_err(req, errno.ENOENT if node is None else errno.EINVAL)
            return
        ll.reply_readlink(req, self.layout.link_target(node).encode("utf-8", "surrogateescape"))

    @_answering
    def _open_file(self, req: int, ino: int, fi: int) -> None:
        if ll.FuseFileInfo.from_address(fi).flags & os.O_ACCMODE != os.O_RDONLY:
            ll.reply_err(req, errno.EROFS)
        elif self.no_open:
            ll.reply_err(req, errno.ENOSYS)
        else:
            ll.reply_open(req, fi)  # handle 0: reads find their file by number all the same

    @_answering
    def _opendir(self, req: int, ino: int, fi: int | None) -> None:
        if self.no_opendir:
            ll.reply_err(req, errno.ENOSYS)
        else:
            ll.reply_open(req, fi)

    @_answering
    def _readdir(self, req: int, ino: int, size: int, offset: int, fi: int | None) -> None:
        self._list(req, ino, size, offset, False)

    @_answering
    def _readdirplus(self, req: int, ino: int, size: int, offset: int, fi: int | None) -> None:
        directory = self._list(req, ino, size, offset, True)
        if directory is None or offset <= 2 or self._store is None:
            return
        listed = self._held
        if listed is not None:  # no value read yet: stored when one is
            if len(listed) >= STORED_DIRECTORIES:
                listed.clear()
            listed[directory.ino] = (directory, offset)
            return
        try:  # answered already: a failure here must not answer again
            self._store_listed(directory, offset)
        except Exception:
            log.exception("storing the value files listed in %s", self.layout.path_of(directory))

    def _list(self, req: int, ino: int, size: int, offset: int, plus: bool) -> Dir | None:
        """Entries from ``offset`` on (each with its attributes if ``plus``) until ``size`` bytes are full, from
        the windows ``CheckpointFS`` makes (each entry's ``fuse_entry_param`` one after another); the directory
        listed, if there is one."""
        directory = self._directory(req, ino)
        if directory is None:
            return None
        if offset >= self.listed_count(directory):  # the request after the last entry, which every listing ends with
            ll.reply_buf(req, None, 0)
            return directory
        with gc_paused():
            if isinstance(directory, ZarrDir):
                self._mirrored.update((node.ino, node) for node in directory.head)
            base, used = _ADDRESS(self._reply_buffer(size)), 0
            add, field = (ll.add_direntry_plus, 0) if plus else (ll.add_direntry, ATTR)
            for window, first in self._windows(directory, offset):
                start, names, address = window.start, window.names, window.address + field
                while plus and start + first < 2:  # . and ..: inode 0, the kernel takes no lookup reference
                    dot = ll.FuseEntryParam.from_buffer_copy(window.memory, first * ENTRY_SIZE)
                    dot.ino = 0
                    need = add(req, base + used, size - used, names.names[first], _ADDRESS(dot), start + first + 1)
                    if need > size - used:
                        ll.reply_buf(req, base, used)
                        return directory
                    used += need
                    first += 1
                used, added = add_entries(add, req, base, size, used, names, address, ENTRY_SIZE, start, first)
                if added < names.count:
                    break
        ll.reply_buf(req, base, used)
        return directory

    def _reply_buffer(self, size: int) -> ctypes.Array[ctypes.c_char]:
        """A buffer of ``size`` bytes at least for this thread's replies, kept: a listing's is sent before the next."""
        found: ctypes.Array[ctypes.c_char] | None = getattr(self._reply_buffers, "reply", None)
        if found is None or len(found) < size:
            found = self._reply_buffers.reply = ctypes.create_string_buffer(size)
        return found

    def _store_listed(self, directory: Dir, offset: int) -> None:
        """Stores the value files of the directory's entries before ``offset``: a listing request from ``offset``
        means the kernel has made the inodes of those before (a store into an inode it does not hold fails)."""
        store, stored = self._store, self._stored
        done = stored.get(directory.ino, 0)
        if (store is None or offset <= done or done >= STORE_FILES or self._store_budget <= 0
                or isinstance(directory, ZarrDir)):
            return
        if len(stored) >= STORED_DIRECTORIES:
            stored.clear()
        if not done:  # first seen: a directory with no value (of tensors, say) is passed over at once
            done = 2 if self.layout.has_values(directory) else STORE_FILES
        stop = stored[directory.ino] = max(min(offset, STORE_FILES), done)
        if stop <= done:
            return
        sizes = self._listing(directory).sizes
        _, inos, kinds = self.layout.listing_columns(directory, done - 2, stop - 2)
        wanted = [i for i, kind in enumerate(kinds) if kind is Kind.VALUE and 0 < sizes[done + i] <= STORE_FILE_BYTES]
        del wanted[self._store_budget :]
        self._store_budget -= len(wanted)
        if not wanted:
            return
        first = wanted[0]
        nodes = self.layout.listing_slice(directory, done - 2 + first, done - 2 + wanted[-1] + 1)
        batch: Batch = []
        for i in wanted:
            try:
                data = self.layout.content(nodes[i - first])
            except Exception:  # its read fails (EIO) as without a store
                continue
            if len(data) == sizes[done + i]:  # a store past the listed size would change the file's size
                batch.append((inos[i], bytes(data)))
                if len(batch) >= STORE_BATCH:
                    store.put(batch)
                    batch = []
        store.put(batch)

    def _stats(self, inos: Column, modes: Column, sizes: array.array[int], bulk: bool = False) -> bytearray:
        """A window's ``fuse_entry_param``s, one after another: the template repeated, the fields that differ
        written a column at a time."""
        memory = bytearray(self._entry * len(inos))
        view = memoryview(memory)
        write_column(view, 0, 8, ENTRY_SIZE, inos)
        for field, values in ((ll.Stat.st_ino, inos), (ll.Stat.st_mode, modes), (ll.Stat.st_size, sizes),
                              (ll.Stat.st_blocks, blocks(sizes, bulk))):
            write_column(view, ATTR + field.offset, field.size, ENTRY_SIZE, values)
        return memory

    @_answering
    def _read(self, req: int, ino: int, size: int, offset: int, fi: int | None) -> None:
        opened = self._kept.get(ino)
        if opened is None:
            if self.remote:  # making its pieces may read the source (a storage's framing)
                self.handoff()
            opened = self._unopened(ino)
        if opened is not None and opened.data is not None:  # generated bytes (a value's): no bufvec to make and free
            chunk = bytes(memoryview(opened.data)[offset : offset + size])
            ll.reply_buf(req, chunk, len(chunk))
            if self._value_read and self._held is not None:
                self._store_all_listed()
            return
        if self.handoff is not _stay and opened is not None and opened.may_wait(offset, size, self.remote):
            self.handoff()
        self._send_read(req, ino, size, offset)

    def _send_read(self, req: int, ino: int, size: int, offset: int) -> None:
        """Answers with the bufvec ``read_buf`` makes; the blocks it is sent from are released once it is sent."""
        bufvec = ctypes.c_void_p()
        failed = self.read_buf(_ADDRESS(bufvec), size, offset, 0, ino)
        if failed:
            ll.reply_err(req, -failed)
            return
        try:
            ll.reply_data(req, bufvec.value, 0)
        finally:
            libfuse.free_bufvec(bufvec.value or 0)
            for source, leased in self._leases.pop(threading.get_ident(), ()):
                source.release(leased)

    def _store_all_listed(self) -> None:
        """The first value file is read: what was listed until now is stored, listings store from now on."""
        listed, self._held = self._held, None
        for directory, offset in (listed or {}).values():
            try:  # the read is answered already: a failure here must not answer again
                self._store_listed(directory, offset)
            except Exception:
                log.exception("storing the value files listed in %s", self.layout.path_of(directory))

    def _unopened(self, ino: int) -> OpenFile | None:
        """The file ``ino`` as an open would make it, kept for the reads that follow; None (logged) if it cannot be
        made, as an open would fail."""
        opened = self._kept.get(ino)
        if opened is not None:
            return opened
        node = self.at(ino)
        if node is None or node.kind is Kind.DIR:
            log.error("inode %d: read of no file", ino)
            return None
        path = "/" + self.layout.path_of(node)  # as logs named it when reads came with paths
        try:
            opened = self._open(path, node)
        except (CkptfsError, OSError) as exc:
            log.error("%s: %s", path, exc)
            return None
        self._kept.add(ino, opened)
        self._value_read = self._value_read or node.kind is Kind.VALUE
        return opened

    @_answering
    def _statfs(self, req: int, ino: int) -> None:
        found = ll.StatVfs(**self.statfs("/"))
        ll.reply_statfs(req, _ADDRESS(found))


def _stay() -> None:
    """``InodeFS.handoff`` of a loop whose threads do not take turns: the read waits where it is."""
