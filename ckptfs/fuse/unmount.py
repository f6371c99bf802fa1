"""``ckptfs umount``: unmounting a ckptfs mount, a dead one included, and saying why it cannot be."""

from __future__ import annotations

import fcntl
import os
import pwd
import shutil
import subprocess
import time

from ckptfs.errors import MountError
from ckptfs.fuse.bindings import INSTALL_HINT
from ckptfs.fuse.mount_table import FSTYPE, absolute_mountpoint, find_mount, is_dead

WRITER_TIMEOUT = 600.0
"""How long ``unmount`` waits for a ``-o rw`` daemon to set its last CRCs and sync the file."""
BUSY_HINT = "busy, in use (an open file or a process's working directory; ckptfs umount -l detaches it now)"


def unmount(mountpoint: str, lazy: bool = False) -> None:
    """Unmounts a ckptfs mount, a dead one (its daemon killed) included; ``lazy`` detaches a busy one now."""
    target = absolute_mountpoint(mountpoint)
    entry = find_mount(target)
    if entry is None:
        raise MountError("not mounted" if os.path.lexists(target) else "does not exist", target)
    if entry.fstype != FSTYPE:
        raise MountError(f"a {entry.fstype} mount, not a ckptfs one", target)
    error = run_unmount(target, lazy=lazy)
    if error is not None and is_dead(target):
        error = run_unmount(target, lazy=True)
    if error is not None:
        raise MountError(f"cannot unmount: {explain(error, entry.owner, os.geteuid())}", target)
    if entry.writable and not lazy:  # lazy: detached now, the daemon finishes when its last file is closed
        wait_for_writer(entry.source, target)


def wait_for_writer(source: str, target: str) -> None:
    """Returns once no process holds the checkpoint open for writing: the daemon of a ``-o rw`` mount holds its
    lock (``writing.TensorWriter``) until every CRC is set and the file synced, after the kernel let go of the
    mount. Nothing to wait for when ``source`` is not a file (``-o fsname=`` named the mount otherwise)."""
    try:
        fd = os.open(source, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return
    try:
        deadline = time.monotonic() + WRITER_TIMEOUT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise MountError(f"unmounted, but its daemon is still writing {source}", target) from None
                time.sleep(0.01)
    finally:
        os.close(fd)


def explain(error: str, owner: int | None, uid: int) -> str:
    """What the unmounting tool's complaint means, said with its cause."""
    if uid != 0 and owner is not None and owner != uid:
        return f"another user's mount ({_user(owner)}); only that user or root can unmount it"
    if "busy" in error:
        return BUSY_HINT
    return error


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name}, uid {uid}"
    except KeyError:
        return f"uid {uid}"


def run_unmount(target: str, lazy: bool) -> str | None:
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
