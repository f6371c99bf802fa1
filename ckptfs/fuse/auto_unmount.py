"""``-o auto_unmount`` for every user: a watcher process unmounts the mount once its daemon is dead (``kill -9`` too).

libfuse 3.14's own auto_unmount (``fusermount3 --auto-unmount``) works for
root only: once the daemon is gone, fusermount3 opens the mount point as root
to see it fail with ENOTCONN, but a FUSE mount without ``allow_other`` refuses
root (EACCES), so a plain user's mount stays (libfuse issue 586, fixed in
3.15). The watcher runs as the mount's owner instead.

It holds the read end of a pipe whose write end only the daemon has: end of
file means the daemon has exited. It then unmounts only a dead ckptfs mount
at that point, never one that was unmounted and mounted again meanwhile.
"""

from __future__ import annotations

import os
import subprocess
import sys

from ckptfs.fuse.mount_table import FSTYPE, find_mount, is_dead
from ckptfs.fuse.unmount import run_unmount

_watchers: list[subprocess.Popen[bytes]] = []
"""Kept so that no ``Popen`` is collected while its watcher runs; this process never waits for them."""


def start_watcher(target: str) -> None:
    """Starts the watcher of ``target`` for this process (the daemon serving it)."""
    read_end, write_end = os.pipe()  # both non-inheritable: no child of the daemon keeps the write end
    _watchers.append(subprocess.Popen(
        [sys.executable, "-m", "ckptfs.fuse.auto_unmount", target, str(read_end)], pass_fds=(read_end,),
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/",
        start_new_session=True))  # a terminal's Ctrl-C (ckptfs mount -f) is not for the watcher
    os.close(read_end)
    # write_end stays open until the daemon exits, however it exits.


def watch(target: str, pipe: int) -> None:
    while os.read(pipe, 4096):
        pass
    entry = find_mount(target)
    if entry is not None and entry.fstype == FSTYPE and is_dead(target):
        run_unmount(target, lazy=True)


if __name__ == "__main__":
    watch(sys.argv[1], int(sys.argv[2]))
