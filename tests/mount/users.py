"""Acting as another user (root only), places every user can reach, and the mount table as findmnt reads it."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pytest

from mount.helpers import CLI, force_unmount, mount_points

IS_ROOT = os.geteuid() == 0
root_only = pytest.mark.skipif(not IS_ROOT, reason="root only: another user, /sbin or mount(8)")


def nobody() -> pwd.struct_passwd:
    return pwd.getpwnam("nobody")


def as_user(user: pwd.struct_passwd, *argv: str | Path) -> list[str]:
    """``argv`` run as ``user`` (setpriv: util-linux, on every Debian; sudo may be missing)."""
    return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", *map(str, argv)]


def cli_as_user(user: pwd.struct_passwd, *args: str | Path) -> list[str]:
    """``ckptfs ARGS`` run as ``user``, who may read every file (CAP_DAC_READ_SEARCH): the checkout and its venv
    may lie where only root reads (/root/repo). FUSE and fusermount3 judge by user id, which stays ``user``'s."""
    caps = ["--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]
    return [*as_user(user), *caps, *CLI, *map(str, args)]


def private_mount_namespace() -> list[str]:
    """unshare's argv for a mount namespace of its own. Where / is no mount point of this root (a chroot whose
    mounts are private already), unshare cannot make / private: propagation then stays as it is."""
    if "/" in mount_points():
        return ["unshare", "--mount"]
    return ["unshare", "--mount", "--propagation", "unchanged"]


def shared_directory() -> Iterator[Path]:
    """A directory every user can reach (pytest's tmp_path is the running user's alone); taken down afterwards."""
    path = Path(tempfile.mkdtemp(prefix="ckptfs-shared-", dir="/tmp"))
    path.chmod(0o777)
    try:
        yield path
    finally:
        for point in list(mount_points()):
            if point.startswith(f"{path}/"):
                force_unmount(Path(point))
        shutil.rmtree(path, ignore_errors=True)


def findmnt(mnt: Path) -> dict[str, Any]:
    """The mount at ``mnt`` as findmnt (util-linux) reports it: target, source, fstype, vfs-options, fs-options."""
    result = subprocess.run(["findmnt", "--json", "--mountpoint", str(mnt), "-o",
                             "TARGET,SOURCE,FSTYPE,VFS-OPTIONS,FS-OPTIONS"], capture_output=True, text=True)
    assert result.returncode == 0, f"findmnt: {mnt} is not mounted {result.stderr}"
    (entry,) = json.loads(result.stdout)["filesystems"]
    return entry
