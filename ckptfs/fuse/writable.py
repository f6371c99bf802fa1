"""The callbacks of a ``-o rw`` mount: ``CheckpointFS`` whose writable tensors' files take writes.

Writes go through ``Checkpoint.writer`` (``ckptfs.writing``): into the tensor's storage range of the file, in
place. Opening for writing a file that is not a writable tensor's, and every other change (create, unlink,
rename, truncate, setattr …), fails with EROFS; a write past a tensor's end with EFBIG. A record whose bytes are
all written gets its CRC-32 when a file of it is closed (``flush``: before ``close`` returns), fsynced, released,
and at unmount (``Checkpoint.close``); from then on its sidecars say ``"written":  true``, as wide as ``false``
(``fs.sidecar``: the sizes they were listed with hold). The kernel keeps no file's pages between opens (other
files show the same bytes: a tensor's views, tied links), and writes reach the daemon as they are made (no
writeback cache).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
from typing import Any, Callable

from ckptfs.checkpoint import Checkpoint
from ckptfs.errors import CkptfsError, NotWritableError, WritePastEndError
from ckptfs.fs.layout import Layout
from ckptfs.fs.nodes import Kind
from ckptfs.fuse import bindings as libfuse
from ckptfs.fuse.operations import MAX_REQUEST, CheckpointFS
from ckptfs.model.records import Tensor
from ckptfs.writing import TensorWriter

log = logging.getLogger("ckptfs.fuse.mount")

_FuseOSError = libfuse.load_mfusepy().FuseOSError

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR


class WritableCheckpointFS(CheckpointFS):
    """``CheckpointFS`` of a checkpoint opened for writing (``mode="r+"``)."""

    def __init__(self, checkpoint: Checkpoint, layout: Layout, on_init: Callable[[], None] | None = None, *,
                 uid: int | None = None, gid: int | None = None, umask: int | None = None) -> None:
        super().__init__(checkpoint, layout, on_init, uid=uid, gid=gid, umask=umask)
        assert checkpoint.writer is not None, "opened with mode='r+'"
        self.writer: TensorWriter = checkpoint.writer
        self._tensors: dict[int, Tensor] = {}
        """The tensor of each handle opened for writing."""
        source = checkpoint.source.stat()
        writable = (source.mode if source else 0o644) & 0o222 if umask is None else 0o222 & ~umask
        # Every entry shows the write bits, so that the kernel's permission check (default_permissions) hands each
        # change to this file system, which answers it: a write into a tensor, else EROFS, for root and any user.
        for kind in self._modes:
            self._modes[kind] |= writable

    def open(self, path: str, flags: int) -> int:
        if not flags & _WRITE_FLAGS:
            return super().open(path, flags)
        node = self.layout.lookup(path)
        if node is None:
            raise _FuseOSError(errno.ENOENT)
        if node.kind is Kind.DIR:
            raise _FuseOSError(errno.EISDIR)
        if node.kind is not Kind.TENSOR or flags & os.O_TRUNC or not self.writer.writable(node.value):
            raise _FuseOSError(errno.EROFS)  # O_TRUNC: the kernel asks for it here (atomic_o_trunc), not by truncate
        handle = super().open(path, os.O_RDONLY)
        self._tensors[handle] = node.value
        return handle

    def write(self, address: int, size: int, offset: int, handle: int) -> int:
        """Raw arguments (see ``adapter.CheckpointFUSE.write``): the kernel's buffer is written from where it is."""
        tensor = self._tensors.get(handle)
        if tensor is None:
            return -errno.EBADF
        data = memoryview((ctypes.c_char * size).from_address(address)).cast("B")
        try:
            return self.writer.write(tensor, data, offset)
        except WritePastEndError:
            return -errno.EFBIG
        except NotWritableError as exc:
            log.error("%s", exc)
            return -errno.EROFS
        except OSError as exc:
            log.error("write of %d bytes at offset %d: %s", size, offset, exc)
            return -(exc.errno or errno.EIO)

    def flush(self, path: str, handle: int) -> int:
        return self._finish(handle)

    def fsync(self, path: str, datasync: int, handle: int) -> int:
        try:
            self.writer.sync()
        except (CkptfsError, OSError) as exc:
            log.error("%s: fsync: %s", path, exc)
            raise _FuseOSError(errno.EIO) from None
        return 0

    def release(self, path: str, handle: int) -> int:
        result = self._finish(handle)
        self._tensors.pop(handle, None)
        super().release(path, handle)
        return result

    def _finish(self, handle: int) -> int:
        tensor = self._tensors.get(handle)
        if tensor is None or tensor.storage is None:
            return 0
        try:
            self.writer.finish([tensor.storage])
        except (CkptfsError, OSError) as exc:
            log.error("setting the CRC-32 of record %s: %s", tensor.storage.record, exc)
            raise _FuseOSError(errno.EIO) from None
        return 0

    def init_with_config(self, conn: Any, config: Any) -> None:
        super().init_with_config(conn, config)
        config.kernel_cache = 0
        conn.max_write = MAX_REQUEST
