"""``ckptfs mount`` and ``ckptfs umount``: mount point checks, the daemon and its readiness, unmounting.

A mount parses the checkpoint in the calling process, then (unless in the
foreground) forks a detached daemon that mounts and serves. The caller returns
only once the mount answers a ``stat``; until then the daemon's stderr is a
pipe to the caller, so whatever stops it (libfuse's own complaints included)
becomes the caller's one-line error.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import importlib
import os
import re
import select
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import traceback
import warnings
from dataclasses import dataclass
from typing import Callable, NoReturn

from ckptfs.checkpoint import Checkpoint, open_checkpoint
from ckptfs.collector import gc_paused
from ckptfs.errors import CkptfsError, MountError
from ckptfs.layout import Layout
from ckptfs.libfuse import INSTALL_HINT
from ckptfs.limits import Limits

FSTYPE = "fuse.ckptfs"
READY = b"\0"
"""Written by the daemon on its stderr pipe once the mount answers; never part of a message."""
START_TIMEOUT = 60.0
DEAD_MOUNT_ERRORS = (errno.ENOTCONN, errno.ECONNABORTED)
"""What a FUSE mount whose daemon died answers."""
READ_AHEAD_KB = 1024
"""Read-ahead of the mount's bdi: lets the kernel send 1 MiB read requests."""

Notify = Callable[[], None]


@dataclass(frozen=True)
class MountOptions:
    foreground: bool = False
    debug: bool = False
    """libfuse logs every request on stderr (the daemon keeps stderr open)."""
    allow_other: bool = False
    multithreaded: bool = False


def mount(source: str, mountpoint: str, options: MountOptions = MountOptions(), limits: Limits = Limits()) -> None:
    """Mounts ``source`` read-only at ``mountpoint``.

    Returns once the mount answers; in the foreground, once it is unmounted again.
    Raises CkptfsError (MountError for mount problems) with nothing left mounted.
    """
    target = absolute_mountpoint(mountpoint)
    check_mountpoint(target)
    with gc_paused():
        checkpoint = open_checkpoint(source, limits)
        try:
            layout = Layout(checkpoint)
            check_fuse()
        except BaseException:
            checkpoint.close()
            raise
    # The parsed tree lives as long as the mount: keep the collector from walking it again and again.
    gc.freeze()

    def serve(notify: Notify | None) -> None:
        _serve(checkpoint, layout, target, options, notify)

    if options.foreground:
        serve(None)
    else:
        _run_detached(serve, target, options.debug)
        checkpoint.close()


def _serve(checkpoint: Checkpoint, layout: Layout, target: str, options: MountOptions, notify: Notify | None) -> None:
    from ckptfs import fuse_ops  # here, not at the top: it loads libfuse3, which ls and info do without

    def on_init() -> None:
        threading.Thread(target=_when_answering, args=(target, notify), daemon=True).start()

    fs = fuse_ops.CheckpointFS(checkpoint, layout, on_init=on_init)
    try:
        fuse_ops.serve(fs, target, fsname=checkpoint.path, allow_other=options.allow_other,
                       multithreaded=options.multithreaded, debug=options.debug)
    finally:
        checkpoint.close()


def _when_answering(target: str, notify: Notify | None) -> None:
    """Runs beside the request loop: waits for the mount to answer, tunes read-ahead, reports readiness."""
    try:
        device = os.stat(target).st_dev
    except OSError as exc:
        print(f"{target}: the new mount does not answer: {exc.strerror}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    raise_read_ahead(device)
    if notify is not None:
        notify()


def raise_read_ahead(device: int) -> None:
    """Sets the mount's read-ahead to 1 MiB (root only; left as it is otherwise)."""
    path = f"/sys/class/bdi/{os.major(device)}:{os.minor(device)}/read_ahead_kb"
    with contextlib.suppress(OSError), open(path, "w") as f:
        f.write(str(READ_AHEAD_KB))


# -- the detached daemon ------------------------------------------------------------


def _run_detached(serve: Callable[[Notify], None], target: str, debug: bool) -> None:
    read_end, write_end = os.pipe()
    pid = _fork()
    if pid == 0:
        os.close(read_end)
        _daemon(serve, write_end, debug)
    os.close(write_end)
    os.waitpid(pid, 0)
    try:
        output, ready = _wait_ready(read_end)
    finally:
        os.close(read_end)
    if ready:
        return
    if target in mount_points():
        _unmount(target, lazy=True)
    lines = [line.strip() for line in output.decode("utf-8", "replace").splitlines() if line.strip()]
    raise MountError("; ".join(lines[-2:]) or f"{target}: the mount daemon exited before the mount was ready")


def _daemon(serve: Callable[[Notify], None], pipe: int, debug: bool) -> NoReturn:
    """The forked child: detaches (second fork), then serves with stderr on the pipe until ready."""
    code = 1
    try:
        os.setsid()
        if _fork() != 0:
            os._exit(0)
        os.chdir("/")
        null = os.open(os.devnull, os.O_RDWR)
        later_stderr = os.dup(2) if debug else null
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.dup2(pipe, 2)

        def notify() -> None:
            os.write(pipe, READY)
            os.dup2(later_stderr, 2)
            os.close(pipe)

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


def _fork() -> int:
    with warnings.catch_warnings():
        # numpy's BLAS keeps idle threads the child never uses; Python 3.12+ warns about forking beside them.
        warnings.simplefilter("ignore", DeprecationWarning)
        return os.fork()


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
            return b"".join(chunks) + chunk.partition(READY)[0], True
        chunks.append(chunk)


# -- checks ---------------------------------------------------------------------------


def absolute_mountpoint(path: str) -> str:
    """The absolute path, resolving symlinks in the parent only (the mount point may be a dead mount)."""
    path = os.path.abspath(path)
    head, tail = os.path.split(path)
    return os.path.join(os.path.realpath(head), tail) if tail else path


def check_fuse() -> None:
    if not os.path.exists("/dev/fuse"):
        raise MountError(f"FUSE is not available: /dev/fuse is missing (load the kernel module: modprobe fuse; "
                         f"{INSTALL_HINT})")
    if not os.access("/dev/fuse", os.R_OK | os.W_OK) and os.geteuid() != 0:
        raise MountError("FUSE is not available: no permission to open /dev/fuse")
    if os.geteuid() != 0 and shutil.which("fusermount3") is None:
        raise MountError(f"FUSE is not available: fusermount3 is missing; {INSTALL_HINT}")
    importlib.import_module("ckptfs.fuse_ops")  # loads libfuse3, or says how to install it


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
        raise _dead_mount(target) if _is_dead(target) else MountError(f"{target}: already a mount point")
    try:
        with os.scandir(target) as entries:
            if next(entries, None) is not None:
                raise MountError(f"{target}: mount point is not empty")
    except OSError as exc:
        raise MountError(f"{target}: cannot list the mount point: {exc.strerror}") from None


def mount_points() -> dict[str, str]:
    """Mount point → file system type, from /proc/self/mountinfo."""
    points: dict[str, str] = {}
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            fields = line.split(b" ")
            fstype = fields[fields.index(b"-") + 1]
            points[os.fsdecode(_unescape_mountinfo(fields[4]))] = os.fsdecode(fstype)
    return points


def _unescape_mountinfo(field: bytes) -> bytes:
    return re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), field)


# -- unmounting -------------------------------------------------------------------------


def unmount(mountpoint: str, lazy: bool = False) -> None:
    """Unmounts a ckptfs mount, a dead one (its daemon killed) included; ``lazy`` detaches a busy one now."""
    target = absolute_mountpoint(mountpoint)
    fstype = mount_points().get(target)
    if fstype is None:
        raise MountError(f"{target}: not mounted")
    if fstype != FSTYPE:
        raise MountError(f"{target}: a {fstype} mount, not a ckptfs one")
    error = _unmount(target, lazy=lazy)
    if error is not None and _is_dead(target):
        error = _unmount(target, lazy=True)
    if error is not None:
        hint = " (a file in it is open; ckptfs umount -l detaches it now)" if "busy" in error else ""
        raise MountError(f"{target}: cannot unmount: {error}{hint}")


def _is_dead(target: str) -> bool:
    """True for a FUSE mount whose daemon is gone (statfs always reaches the daemon; stat may be cached)."""
    try:
        os.statvfs(target)
    except OSError as exc:
        return exc.errno in DEAD_MOUNT_ERRORS
    return False


def _dead_mount(target: str) -> MountError:
    return MountError(f"{target}: a dead mount is still there (its daemon is gone); "
                      f"clear it with: ckptfs umount {target}")


def _unmount(target: str, lazy: bool) -> str | None:
    """Runs fusermount3 (or umount as root); the tool's complaint, None on success."""
    tool = shutil.which("fusermount3")
    if tool is not None:
        argv = [tool, "-uz" if lazy else "-u", target]
    elif os.geteuid() == 0 and shutil.which("umount") is not None:
        argv = ["umount", *(["-l"] if lazy else []), target]
    else:
        return f"fusermount3 is missing; {INSTALL_HINT}"
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode == 0:
        return None
    lines = result.stderr.strip().splitlines()
    return lines[-1] if lines else f"{os.path.basename(argv[0])} exited with status {result.returncode}"
