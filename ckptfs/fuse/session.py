"""A read-only mount's FUSE session on libfuse3's low-level API: mount, answer requests by inode number
(``fuse.inodes``) until unmounted or stopped by SIGINT/SIGTERM/SIGHUP, unmount."""

from __future__ import annotations

import ctypes
import os
import signal

from ckptfs.errors import MountError
from ckptfs.fuse import bindings as libfuse
from ckptfs.fuse import lowlevel as ll
from ckptfs.fuse.inodes import InodeFS
from ckptfs.fuse.turns import TakingTurns

WAITING_READS = 16
"""Reads waiting on the network at once, each on its own thread (``fuse.turns``): as many as
``--max-connections``' default."""


def serve(fs: InodeFS, mountpoint: str, *, fsname: str, flags: list[str], multithreaded: bool = False,
          debug: bool = False) -> None:
    """Mounts read-only and answers requests until unmounted (or SIGINT/SIGTERM/SIGHUP, which unmount).

    ``flags``: libfuse ``-o`` options besides those every mount has (``allow_other``, ``noexec`` …).
    """
    libfuse.keep_large_buffers_on_heap()
    escaped = fsname.replace("\\", "\\\\").replace(",", "\\,")
    options = ["ro", "default_permissions", f"max_read={libfuse.MAX_READ}", f"fsname={escaped}", "subtype=ckptfs", *flags]
    arguments = [b"ckptfs", b"-o", ",".join(options).encode("utf-8", "surrogateescape"), *([b"-d"] if debug else [])]
    args = ll.make_args(arguments)
    operations = fs.operations()
    session = ll.session_new(ctypes.byref(args), ctypes.byref(operations), ctypes.sizeof(operations), None)
    ll.opt_free_args(ctypes.byref(args))
    if not session:
        raise MountError(f"libfuse could not mount {mountpoint} (options {','.join(options)!r})")
    try:
        status = _mount_and_loop(fs, session, mountpoint, multithreaded)
    finally:
        ll.session_destroy(session)
    if status < 0 or (status > 0 and status not in ll.STOPPING_SIGNALS):
        raise MountError(f"the FUSE session of {mountpoint} failed: {os.strerror(abs(status))}")


def _mount_and_loop(fs: InodeFS, session: int, mountpoint: str, multithreaded: bool) -> int:
    # libfuse installs a handler only where the default is: Python's own SIGINT handler would never run (the loop
    # is in C), so it makes way while the session runs.
    python_handler = signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        if ll.set_signal_handlers(session) != 0:
            raise MountError(f"libfuse could not set its signal handlers for {mountpoint}")
        try:
            if ll.session_mount(session, os.fsencode(mountpoint)) != 0:
                raise MountError(f"libfuse could not mount {mountpoint}")
            try:
                with fs.storing(session):  # ends before the unmount closes the session's device
                    return _loop(fs, session, multithreaded)
            finally:
                ll.session_unmount(session)
        finally:
            ll.remove_signal_handlers(session)
    finally:
        signal.signal(signal.SIGINT, python_handler)


def _loop(fs: InodeFS, session: int, multithreaded: bool) -> int:
    """libfuse's loop on this thread, on its own threads (``multithreaded``), or for a source reads may wait on,
    threads taking turns (``fuse.turns``)."""
    if not multithreaded and fs.remote:
        turns = TakingTurns(session, 2 + WAITING_READS)
        fs.handoff = turns.handoff
        return turns.run()
    if not multithreaded:
        return ll.session_loop(session)  # type: ignore[no-any-return]
    config = ll.loop_cfg_create()
    try:
        return ll.session_loop_mt(session, config)  # type: ignore[no-any-return]
    finally:
        ll.loop_cfg_destroy(config)
