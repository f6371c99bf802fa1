"""The mount table (/proc/self/mountinfo) as ckptfs needs it: which mounts are ckptfs's, whose, and which are dead."""

from __future__ import annotations

import errno
import os
import re
import threading
import time
from dataclasses import dataclass

FSTYPE = "fuse.ckptfs"
DEAD_MOUNT_ERRORS = (errno.ENOTCONN, errno.ECONNABORTED)
"""What a FUSE mount whose daemon died answers."""
ANSWER_TIMEOUT = 2.0
"""Seconds ``answering`` waits for a daemon's statfs: a stopped or stuck daemon never answers, and the kernel
waits for it as long as it lives."""


@dataclass(frozen=True, slots=True)
class MountEntry:
    point: str
    fstype: str
    source: str
    """The mount's source (for ckptfs: the checkpoint's absolute path, unless ``-o fsname=`` named it otherwise)."""
    owner: int | None
    """The user who mounted it (a FUSE mount's ``user_id``); None for other file systems."""
    writable: bool = False
    """Mounted read-write (for ckptfs: ``-o rw``)."""


def mount_table() -> list[MountEntry]:
    entries = []
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            fields = line.rstrip(b"\n").split(b" ")
            dash = fields.index(b"-")
            fstype, source, options = fields[dash + 1 : dash + 4]
            owner = re.search(rb"(?:^|,)user_id=(\d+)", options)
            entries.append(MountEntry(_field(fields[4]), os.fsdecode(fstype), _field(source),
                                      int(owner.group(1)) if owner else None, b"rw" in fields[5].split(b",")))
    return entries


def _field(field: bytes) -> str:
    """A mountinfo field without its octal escapes (space, tab, newline, backslash)."""
    return os.fsdecode(re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), field))


def mount_points() -> dict[str, str]:
    """Mount point → file system type (the last mount wins where mounts are stacked)."""
    return {entry.point: entry.fstype for entry in mount_table()}


def ckptfs_mounts() -> list[MountEntry]:
    return [entry for entry in mount_table() if entry.fstype == FSTYPE]


def find_mount(point: str) -> MountEntry | None:
    """The mount at ``point`` (the top one where mounts are stacked)."""
    return next((entry for entry in reversed(mount_table()) if entry.point == point), None)


def absolute_mountpoint(path: str) -> str:
    """The absolute path with every symlink resolved (a dead mount, answering nothing, stays as it is)."""
    return os.path.realpath(path)


def is_dead(target: str) -> bool:
    """True for a FUSE mount whose daemon is gone (statfs always reaches the daemon; stat may be cached)."""
    try:
        os.statvfs(target)
    except OSError as exc:
        return exc.errno in DEAD_MOUNT_ERRORS
    return False


def answering(targets: list[str], timeout: float = ANSWER_TIMEOUT) -> dict[str, bool | None]:
    """Each mount: True if its daemon answers statfs, False if it is dead, None if no answer came within
    ``timeout`` seconds (all asked at once, on threads left behind if they never return)."""
    answers: dict[str, bool] = {}

    def ask(target: str) -> None:
        answers[target] = not is_dead(target)

    threads = [threading.Thread(target=ask, args=(target,), daemon=True) for target in targets]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return {target: answers.get(target) for target in targets}
