"""Real mounts for the hostile suite: where daemons are, what is mounted, and taking it all down."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from mount.helpers import mount_points


def holders(path: Path) -> list[int]:
    """Processes holding ``path`` open (a directory: any file in it)."""
    return [pid for pid, targets in _open_files() if _holds(targets, path)]


def _holds(targets: set[str], path: Path) -> bool:
    return str(path) in targets or any(target.startswith(f"{path}/") for target in targets)


def daemon_serving(source: Path, timeout: float = 20.0) -> int:
    """The FUSE daemon that holds ``source`` (a file, or a file of a directory) open (other mounts may come and go
    meanwhile)."""
    deadline = time.monotonic() + timeout
    while True:
        found = [pid for pid, targets in _open_files() if "/dev/fuse" in targets and _holds(targets, source)]
        if len(found) == 1:
            return found[0]
        assert time.monotonic() < deadline, f"expected one daemon serving {source}, found {found}"
        time.sleep(0.01)


def _open_files() -> list[tuple[int, set[str]]]:
    processes = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
            processes.append((int(entry), {os.readlink(f"/proc/{entry}/fd/{fd}") for fd in fds}))
        except OSError:
            continue
    return processes


def peak_rss(pid: int) -> int:
    """VmHWM of a process, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for {pid}")


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except OSError:
        return True


def wait_gone(pid: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not gone(pid):
        assert time.monotonic() < deadline, f"process {pid} still running"
        time.sleep(0.005)


def force_unmount(mnt: Path) -> None:
    for flags in ("-u", "-uz"):
        if str(mnt) not in mount_points():
            return
        subprocess.run(["fusermount3", flags, str(mnt)], capture_output=True)


class Mounts:
    """Fresh mount points under ``base``; ``cleanup`` unmounts each and waits for its daemon to exit."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.made: list[Path] = []
        self.daemons: set[int] = set()

    def directory(self) -> Path:
        mnt = self.base / f"m{len(self.made)}"
        mnt.mkdir(parents=True)
        self.made.append(mnt)
        return mnt

    def cleanup(self) -> None:
        for mnt in self.made:
            force_unmount(mnt)
        for pid in self.daemons:
            wait_gone(pid)
