"""Helpers for real mounts: the CLI, /proc/self/mountinfo, daemons, clean-up."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest
from index_files import file_of_path

from ckptfs.model.encoding import encode_key

CLI = [sys.executable, "-m", "ckptfs.cli"]


def run_cli(*args: str | Path, env: dict[str, str] | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env)


def mount_points() -> dict[str, str]:
    """Mount point → file system type, read independently of ckptfs."""
    points = {}
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            fields = line.split()
            point = re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), fields[4])
            points[os.fsdecode(point)] = os.fsdecode(fields[fields.index(b"-") + 1])
    return points


def force_unmount(mnt: Path) -> None:
    for flags in ("-u", "-uz"):
        if str(mnt) not in mount_points():
            return
        subprocess.run(["fusermount3", flags, str(mnt)], capture_output=True)


def daemon_pids(mnt: Path) -> list[int]:
    """Processes whose command line names the mount point: the daemon of a background mount."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"mount" in argv and os.fsencode(mnt) in argv:
                pids.append(int(entry))
    return pids


def wait_until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


class Mounter:
    """Mounts sources on fresh directories under ``base`` with ``ckptfs mount``."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.made: list[Path] = []

    def directory(self) -> Path:
        mnt = self.base / f"m{len(self.made)}"
        mnt.mkdir(parents=True)
        self.made.append(mnt)
        return mnt

    def __call__(self, source: Path, *args: str) -> Path:
        mnt = self.directory()
        result = run_cli("mount", source, mnt, *args)
        assert result.returncode == 0 and result.stderr == "", result.stderr
        assert mount_points().get(str(mnt)) == "fuse.ckptfs"
        return mnt

    def cleanup(self) -> None:
        """Unmounts everything made here, then waits (a while at most) for the daemons to exit."""
        for mnt in self.made:
            force_unmount(mnt)
        deadline = time.monotonic() + 20
        for mnt in self.made:
            for pid in daemon_pids(mnt):
                while time.monotonic() < deadline and not _gone(pid):
                    time.sleep(0.01)


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except OSError:
        return True


def tensor_file(mnt: Path, path: tuple[Any, ...]) -> Path:
    """Where a tensor path lives in the mount (through symlinks for shared objects), as the index says."""
    index = json.loads((mnt / ".ckptfs" / "index.json").read_bytes())
    return mnt / file_of_path(index, [encode_key(key) for key in path])


def require_fuse() -> None:
    """Mount tests run wherever /dev/fuse exists; without it they skip, or fail under CKPTFS_REQUIRE_FUSE=1."""
    if os.path.exists("/dev/fuse"):
        return
    if os.environ.get("CKPTFS_REQUIRE_FUSE") == "1":
        pytest.fail("CKPTFS_REQUIRE_FUSE=1 but /dev/fuse is missing: the mount tests cannot run")
    pytest.skip("/dev/fuse is missing")

