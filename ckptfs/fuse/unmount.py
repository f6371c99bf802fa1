"""``ckptfs umount``: unmounting a ckptfs mount, a dead one included, and saying why it cannot be."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess

from ckptfs.errors import MountError
from ckptfs.fuse.bindings import INSTALL_HINT
from ckptfs.fuse.mount_table import FSTYPE, absolute_mountpoint, find_mount, is_dead

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
