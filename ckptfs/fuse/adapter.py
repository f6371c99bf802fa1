"""mfusepy's FUSE loop driving an ``-o rw`` mount (``fuse.writable``): raw C arguments for the hot callbacks, the mount
options. Read-only mounts are served on libfuse's low-level API instead (``fuse.session``)."""

from __future__ import annotations

import ctypes
import errno
import logging
from typing import Any

from ckptfs.errors import MountError
from ckptfs.fuse import bindings as libfuse
from ckptfs.fuse.operations import CheckpointFS
from ckptfs.gc_pause import gc_paused

mfusepy = libfuse.load_mfusepy()

log = logging.getLogger("ckptfs.fuse.mount")

LOOP_ENDED_BY_SIGNAL = 8
"""What ``fuse_main`` returns once SIGINT/SIGTERM/SIGHUP ended the loop (and the mount)."""


class CheckpointFUSE(mfusepy.FUSE):  # type: ignore[misc]
    """mfusepy's FUSE, handing ``getattr``, ``readdir`` and ``read_buf`` their raw C arguments."""

    def getattr_fuse_3(self, path: bytes, buf: Any, fip: Any) -> int:
        try:
            return self.operations.getattr(path, buf)
        except Exception:
            log.exception("getattr %r", path)
            return -errno.EIO

    def readdir_fuse_3(self, path: bytes, buf: Any, filler: Any, offset: int, fip: Any, flags: int) -> int:
        try:
            with gc_paused():
                return self.operations.readdir(path, buf, filler, offset, flags)
        except Exception:
            log.exception("readdir %r", path)
            return -errno.EIO

    def read_buf(self, path: int, bufpp: int, size: int, offset: int, fip: int) -> int:
        """Raw addresses (see ``bindings.RawReadBuf``): no path bytes, no pointer objects, no mfusepy wrapper."""
        try:
            return self.operations.read_buf(bufpp, size, offset, _U64.from_address(fip + _FH_OFFSET).value, path)
        except BaseException:
            log.exception("read_buf")
            return -errno.EIO


    def write(self, path: Any, buf: Any, size: int, offset: int, fip: Any) -> int:
        """The kernel's buffer as an address (``WritableCheckpointFS.write`` writes from it without a copy)."""
        try:
            return self.operations.write(ctypes.cast(buf, ctypes.c_void_p).value, size, offset, fip.contents.fh)
        except mfusepy.FuseOSError as exc:
            return -exc.errno
        except BaseException:
            log.exception("write")
            return -errno.EIO


_U64 = ctypes.c_uint64
_FH_OFFSET = mfusepy.fuse_file_info.fh.offset


def serve(fs: CheckpointFS, mountpoint: str, *, fsname: str, flags: list[str], multithreaded: bool = False,
          debug: bool = False) -> None:
    """Mounts read-write and answers requests until unmounted (or SIGINT/SIGTERM/SIGHUP, which unmount).

    ``flags``: libfuse ``-o`` options besides those every mount has (``allow_other``, ``noexec`` …).
    """
    libfuse.keep_large_buffers_on_heap()
    options: dict[str, Any] = {
        "foreground": True, "nothreads": not multithreaded, "debug": debug,
        "default_permissions": True, "max_read": libfuse.MAX_READ,
        "fsname": fsname.replace("\\", "\\\\").replace(",", "\\,"), "subtype": "ckptfs",
        **dict.fromkeys(flags, True),
    }
    try:
        with libfuse.raw_read_buf(mfusepy):
            CheckpointFUSE(fs, mountpoint, raw_fi=False, encoding="utf-8", errors="surrogateescape", **options)
    except RuntimeError as exc:
        # libfuse ends its loop with status 8 when a signal stopped it, after unmounting: a clean end.
        if not (fs.initialized and exc.args == (LOOP_ENDED_BY_SIGNAL,)):
            raise MountError(f"libfuse could not mount {mountpoint} (status {exc})") from None
