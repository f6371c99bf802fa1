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

from mount.helpers import force_unmount, mount_points

IS_ROOT = os.geteuid() == 0
root_only = pytest.mark.skipif(not IS_ROOT, reason="root only: another user, /sbin or mount(8)")


def nobody() -> pwd.struct_passwd:
    return pwd.getpwnam("nobody")


def as_user(user: pwd.struct_passwd, *argv: str | Path) -> list[str]:
    """``argv`` run as ``user`` (setpriv: util-linux, on every Debian; sudo may be missing)."""
    return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", *map(str, argv)]


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
