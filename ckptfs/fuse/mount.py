"""``ckptfs mount``: mount point checks, the daemon and its readiness.

A mount parses the checkpoint in the calling process, then (unless in the
foreground) forks a detached daemon that mounts and serves. The caller returns
only once the mount answers a ``stat``; until then the daemon's stderr is a
pipe to the caller, so whatever stops it (libfuse's own complaints included)
becomes the caller's one-line error. Afterwards the daemon logs as
``ckptfs.fuse.daemon_log`` says.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import grp
import importlib
import os
import select
import shutil
import signal
import stat
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Callable, NoReturn

from ckptfs.background import detach, fork
from ckptfs.checkpoint import Checkpoint, open_checkpoint
from ckptfs.errors import CkptfsError, MountError
from ckptfs.fs.layout import Layout
from ckptfs.fuse import daemon_log
from ckptfs.fuse.bindings import INSTALL_HINT
from ckptfs.fuse.mount_options import MountOptions, check_options, libfuse_flags
from ckptfs.fuse.mount_table import DEAD_MOUNT_ERRORS, absolute_mountpoint, is_dead, mount_points
from ckptfs.gc_pause import gc_paused
from ckptfs.limits import Limits
from ckptfs.sources import RemoteOptions, is_url

__all__ = ["MountOptions", "mount"]

FUSE_DEVICE = "/dev/fuse"
READY = b"\0"
"""Written by the daemon on its stderr pipe once the mount answers; never part of a message."""
START_TIMEOUT = 60.0
READ_AHEAD_KB = 1024
"""Read-ahead of the mount's bdi: lets the kernel send 1 MiB read requests."""

Notify = Callable[[], None]

_LEFT_TO_EXIT: list[tuple[Checkpoint, Layout]] = []
"""The parsed trees of the background mounts started with ``leave_to_exit``: the daemon serves its own copy, and the
command ends with ``os._exit`` without freeing this one object by object."""


def mount(source: str, mountpoint: str, options: MountOptions = MountOptions(), limits: Limits = Limits(),
          remote: RemoteOptions = RemoteOptions(), cache_dir: Path | None = None, leave_to_exit: bool = False) -> None:
    """Mounts ``source`` (a path or a URL, reached as ``remote`` says) read-only at ``mountpoint``; the parse
    is cached below ``cache_dir`` (``ckptfs.cache``), if given. ``leave_to_exit``: a command about to end with
    ``os._exit`` keeps its copy of the parsed tree to the end instead of freeing it on return.

    Returns once the mount answers; in the foreground, once it is unmounted again.
    Raises CkptfsError (MountError for mount problems) with nothing left mounted.
    """
    target = absolute_mountpoint(mountpoint)
    check_mountpoint(target)
    if options.max_connections is not None:
        remote = remote._replace(max_connections=options.max_connections)
    check_options(options)
    log_fd = daemon_log.open_log_file(options.log_file)
    daemon_log.log_to_stderr(options.debug)
    try:
        checkpoint, layout = _parse(source, limits, remote, cache_dir, options)
    except BaseException:
        if log_fd is not None:
            os.close(log_fd)
        raise

    def serve(notify: Notify | None) -> None:
        _serve(checkpoint, layout, target, options, notify)

    def serve_forked(notify: Notify | None) -> None:
        checkpoint.source.reopen()  # in the daemon: what a source cannot share across a fork is made anew
        serve(notify)

    if options.foreground:
        checkpoint.save_parse_in_background()
        _serve_in_foreground(serve, log_fd, options.debug)
    else:
        _run_detached(serve_forked, target, log_fd, options.debug)
        checkpoint.save_parse_in_background()
        checkpoint.close()
        if log_fd is not None:
            os.close(log_fd)
        if leave_to_exit:
            _LEFT_TO_EXIT.append((checkpoint, layout))


def _parse(source: str, limits: Limits, remote: RemoteOptions, cache_dir: Path | None,
           options: MountOptions) -> tuple[Checkpoint, Layout]:
    with gc_paused():
        checkpoint = open_checkpoint(source if is_url(source) else os.path.abspath(source), limits, remote,
                                     cache_dir, mode="r+" if options.rw else "r", save_later=True)
        try:
            shown = checkpoint.as_state_dict() if options.state_dict else checkpoint
            layout = Layout(shown, views=options.views, nest=options.nest, zarr_chunk=options.zarr_chunk)
            check_fuse()
        except BaseException:
            checkpoint.close()
            raise
        # The parsed tree lives as long as the mount: keep the collector from walking it again and again, starting
        # with the full collection that the allocations counted while paused would set off once it is back on.
        gc.freeze()
    _give_back_freed_memory()
    return checkpoint, layout


def _give_back_freed_memory() -> None:
    """Returns to the system the heap the parse freed (its pickle, its scanner's rows): glibc keeps it for later
    allocations, and a daemon forked now would start with it resident, its peak RSS too."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # a C library other than glibc: nothing to do
        return
    trim(0)


def _serve_in_foreground(serve: Callable[[Notify | None], None], log_fd: int | None, debug: bool) -> None:
    """Serves until unmounted. With a log file, log records go there, and stderr too once the mount answers
    (until then libfuse's complaints are the terminal's); stderr comes back after."""
    if log_fd is None:
        serve(None)
        return
    daemon_log.log_to_file(log_fd, debug)
    terminal = os.dup(2)
    try:
        serve(lambda: daemon_log.redirect_stderr(log_fd))
    finally:
        os.dup2(terminal, 2)
        os.close(terminal)
        daemon_log.log_to_stderr(debug)


def _serve(checkpoint: Checkpoint, layout: Layout, target: str, options: MountOptions, notify: Notify | None) -> None:
    def on_init() -> None:
        threading.Thread(target=_when_answering, args=(target, options.auto_unmount, notify), daemon=True).start()

    fsname, flags = options.fsname or checkpoint.path, libfuse_flags(options)
    try:
        # imported here: they load libfuse3, which ls and info do without
        if options.rw:
            from ckptfs.fuse import adapter
            from ckptfs.fuse.writable import WritableCheckpointFS

            writable = WritableCheckpointFS(checkpoint, layout, on_init=on_init, uid=options.uid, gid=options.gid,
                                            umask=options.umask)
            adapter.serve(writable, target, fsname=fsname, flags=flags, multithreaded=options.multithreaded,
                          debug=options.debug)
        else:
            from ckptfs.fuse import session
            from ckptfs.fuse.inodes import InodeFS

            fs = InodeFS(checkpoint, layout, on_init=on_init, uid=options.uid, gid=options.gid, umask=options.umask)
            session.serve(fs, target, fsname=fsname, flags=flags, multithreaded=options.multithreaded,
                          debug=options.debug)
    finally:
        checkpoint.close()


def _when_answering(target: str, auto_unmount: bool, notify: Notify | None) -> None:
    """Runs beside the request loop: waits for the mount to answer, tunes read-ahead, starts the auto_unmount
    watcher, reports readiness."""
    try:
        device = os.stat(target).st_dev
    except OSError as exc:
        print(f"{target}: the new mount does not answer: {exc.strerror}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    raise_read_ahead(device)
    if auto_unmount:
        from ckptfs.fuse.auto_unmount import start_watcher  # here: it imports subprocess, which a mount does without

        start_watcher(target)
    if notify is not None:
        notify()


def raise_read_ahead(device: int) -> None:
    """Sets the mount's read-ahead to 1 MiB (root only; left as it is otherwise)."""
    path = f"/sys/class/bdi/{os.major(device)}:{os.minor(device)}/read_ahead_kb"
    with contextlib.suppress(OSError), open(path, "w") as f:
        f.write(str(READ_AHEAD_KB))


# -- the detached daemon ------------------------------------------------------------


def _run_detached(serve: Callable[[Notify], None], target: str, log_fd: int | None, debug: bool) -> None:
    """Forks the daemon and returns once it serves; else raises MountError."""
    read_end, write_end = os.pipe()
    pid = fork()
    if pid == 0:
        os.close(read_end)
        _daemon(serve, write_end, log_fd, debug)
    os.close(write_end)
    os.waitpid(pid, 0)
    try:
        output, ready = _wait_ready(read_end)
    finally:
        os.close(read_end)
    if ready:
        return
    if target in mount_points():
        from ckptfs.fuse.unmount import run_unmount  # here: it imports subprocess, which a mount does without

        run_unmount(target, lazy=True)
    lines = [line.strip() for line in output.decode("utf-8", "replace").splitlines() if line.strip()]
    raise MountError("; ".join(lines[-2:]) or f"{target}: the mount daemon exited before the mount was ready")


def _daemon(serve: Callable[[Notify], None], pipe: int, log_fd: int | None, debug: bool) -> NoReturn:
    """The forked child: detaches (second fork), then serves with stderr on the pipe until ready."""
    code = 1
    try:
        detach()
        os.chdir("/")
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.dup2(pipe, 2)

        def notify() -> None:
            # Logs and stderr move first: whatever happens once the caller has returned goes where it belongs.
            if log_fd is None:
                daemon_log.log_nowhere()
            else:
                daemon_log.log_to_file(log_fd, debug)
            daemon_log.redirect_stderr(null if log_fd is None else log_fd)
            os.write(pipe, READY)
            os.close(pipe)
            if log_fd is None:
                daemon_log.log_to_syslog(debug)  # after READY: importing its handler costs ~10 ms

        serve(notify)
        code = 0
    except CkptfsError as exc:
        print(exc, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os._exit(code)


def _wait_ready(pipe: int) -> tuple[bytes, bool]:
    """The daemon's output until it reports readiness (True) or closes the pipe (False)."""
    chunks: list[bytes] = []
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([pipe], [], [], remaining)[0]:
            chunks.append(f"\nno answer from the mount within {START_TIMEOUT:.0f} s".encode())
            return b"".join(chunks), False
        chunk = os.read(pipe, 65536)
        if not chunk:
            return b"".join(chunks), False
        if READY in chunk:
            _wait_closed(pipe, deadline)
            return b"".join(chunks) + chunk.partition(READY)[0], True
        chunks.append(chunk)


def _wait_closed(pipe: int, deadline: float) -> None:
    """Reads the pipe to its end: the daemon closes it right after reporting readiness."""
    while (remaining := deadline - time.monotonic()) > 0 and select.select([pipe], [], [], remaining)[0]:
        if not os.read(pipe, 65536):
            return


# -- checks ---------------------------------------------------------------------------


def check_fuse() -> None:
    if not os.path.exists(FUSE_DEVICE):
        raise MountError(f"FUSE is not available: {FUSE_DEVICE} is missing (load the kernel module: modprobe fuse; "
                         f"{INSTALL_HINT})")
    if os.geteuid() != 0 and not os.access(FUSE_DEVICE, os.R_OK | os.W_OK):
        raise MountError(f"FUSE is not available: {device_access_problem(FUSE_DEVICE, os.stat(FUSE_DEVICE))}")
    if os.geteuid() != 0 and shutil.which("fusermount3") is None:
        raise MountError(f"FUSE is not available: fusermount3 is missing; {INSTALL_HINT}")
    importlib.import_module("ckptfs.fuse.operations")  # loads libfuse3, or says how to install it


def device_access_problem(device: str, st: os.stat_result) -> str:
    """Why this user cannot open the FUSE device, and what would let it."""
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    mode = stat.filemode(st.st_mode)
    needed = "ask root to make it mode 0666 (the default of Debian's udev rules)"
    if st.st_mode & 0o060 == 0o060 and st.st_gid != 0:
        needed = f"join group {group} (then log in again) or {needed}"
    return f"no permission to open {device} (mode {mode}, group {group}): {needed}"


def check_mountpoint(target: str) -> None:
    try:
        st = os.stat(target)
    except FileNotFoundError:
        raise MountError(f"{target}: mount point does not exist") from None
    except OSError as exc:
        if exc.errno in DEAD_MOUNT_ERRORS:
            raise _dead_mount(target) from None
        raise MountError(f"{target}: cannot use as a mount point: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise MountError(f"{target}: mount point is not a directory")
    if target in mount_points():
        raise _dead_mount(target) if is_dead(target) else MountError(f"{target}: already a mount point")
    try:
        with os.scandir(target) as entries:
            if next(entries, None) is not None:
                raise MountError(f"{target}: mount point is not empty")
    except OSError as exc:
        raise MountError(f"{target}: cannot list the mount point: {exc.strerror}") from None


def _dead_mount(target: str) -> MountError:
    return MountError(f"{target}: a dead mount is still there (its daemon is gone); "
                      f"clear it with: ckptfs umount {target}")
