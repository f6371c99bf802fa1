"""Mounting and unmounting through the CLI: errors, read-only behaviour, dead mounts, signals."""

from __future__ import annotations

import errno
import grp
import json
import os
import re
import signal
import socket
import stat
import subprocess
import zipfile
from pathlib import Path
from typing import Callable

import pytest
import torch
from corpus import save_zip

from ckptfs.fuse.mount import device_access_problem
from mount.helpers import CLI, Mounter, daemon_pids, mount_points, run_cli, wait_until
from mount.users import cli_as_user, nobody, private_mount_namespace, root_only

pytestmark = pytest.mark.mount


@pytest.fixture
def source(tmp_path: Path) -> Path:
    return save_zip({"m": {"w": torch.arange(12.0).reshape(3, 4)}, "epoch": 3}, tmp_path / "model.pt")


def mounted_under(directory: Path) -> list[str]:
    """Mount points below ``directory`` (other processes may mount elsewhere meanwhile)."""
    return [point for point in mount_points() if point.startswith(f"{directory}/")]


def assert_one_line_error(result: subprocess.CompletedProcess[str], pattern: str) -> None:
    assert result.returncode != 0
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckptfs: "), result.stderr
    assert re.search(pattern, lines[0]), lines[0]


def _missing(tmp: Path, src: Path, mnt: Path) -> tuple[Path, Path]:
    return tmp / "nope.pt", mnt


def _directory_source(tmp: Path, src: Path, mnt: Path) -> tuple[Path, Path]:
    return tmp, mnt


def _unreadable_source(tmp: Path, src: Path, mnt: Path) -> tuple[Path, Path]:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp / "socket.pt"))
    sock.close()
    return tmp / "socket.pt", mnt


def _not_a_checkpoint(tmp: Path, src: Path, mnt: Path) -> tuple[Path, Path]:
    junk = tmp / "junk.pt"
    junk.write_bytes(b"not a checkpoint at all" * 10)
    return junk, mnt


def _mountpoint_missing(tmp: Path, src: Path, mnt: Path) -> tuple[Path, Path]:
    return src, tmp / "absent"


def _mountpoint_a_file(tmp: Path, src: Path, mnt: Path) -> tuple[Path, Path]:
    return src, src


def _mountpoint_not_empty(tmp: Path, src: Path, mnt: Path) -> tuple[Path, Path]:
    (mnt / "something").write_text("x")
    return src, mnt


BAD_INVOCATIONS: dict[str, tuple[Callable[[Path, Path, Path], tuple[Path, Path]], str]] = {
    "missing source": (_missing, "No such file"),
    "source is a directory": (_directory_source, "directory"),
    "source cannot be opened": (_unreadable_source, "cannot open"),
    "not a checkpoint": (_not_a_checkpoint, "not a|checkpoint"),
    "mount point missing": (_mountpoint_missing, "does not exist"),
    "mount point is a file": (_mountpoint_a_file, "not a directory"),
    "mount point not empty": (_mountpoint_not_empty, "not empty"),
}


@pytest.mark.parametrize("case", BAD_INVOCATIONS)
def test_bad_invocation(tmp_path: Path, source: Path, case: str) -> None:
    make, pattern = BAD_INVOCATIONS[case]
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    src, target = make(tmp_path, source, mnt)
    assert_one_line_error(run_cli("mount", src, target), pattern)
    assert not mounted_under(tmp_path)


def test_already_a_mount_point(source: Path, mounter: Mounter) -> None:
    mnt = mounter(source)
    assert_one_line_error(run_cli("mount", source, mnt), "already a mount point")
    assert os.listdir(mnt)


def test_fuse_unavailable_says_how_to_install(tmp_path: Path, source: Path) -> None:
    (tmp_path / "mnt").mkdir()
    env = dict(os.environ, FUSE_LIBRARY_PATH=str(tmp_path / "libfuse3.so.3"))
    assert_one_line_error(run_cli("mount", source, tmp_path / "mnt", env=env), "install fuse3")
    assert not mounted_under(tmp_path)


def test_writes_fail_with_erofs(source: Path, mounter: Mounter) -> None:
    mnt = mounter(source)
    w = mnt / "m" / "w"
    attempts: list[Callable[[], object]] = [
        lambda: open(w, "r+b"),
        lambda: open(w, "wb"),
        lambda: open(mnt / "new", "w"),
        lambda: os.mkdir(mnt / "d"),
        lambda: os.rename(w, mnt / "m" / "v"),
        lambda: os.chmod(w, 0o644),
        lambda: os.chown(w, 0, 0),
        lambda: os.unlink(w),
        lambda: os.rmdir(mnt / "m"),
        lambda: os.symlink("w", mnt / "m" / "link"),
        lambda: os.truncate(w, 0),
        lambda: os.utime(w, (0, 0)),
        lambda: os.setxattr(w, "user.x", b"1"),
    ]
    for attempt in attempts:
        with pytest.raises(OSError) as caught:
            attempt()
        assert caught.value.errno == errno.EROFS, caught.value
    assert w.read_bytes() == torch.arange(12.0).numpy().tobytes()


def test_umount(source: Path, mounter: Mounter) -> None:
    mnt = mounter(source)
    result = run_cli("umount", mnt)
    assert result.returncode == 0 and result.stderr == ""
    assert str(mnt) not in mount_points() and os.listdir(mnt) == []
    assert_one_line_error(run_cli("umount", mnt), "not mounted")


def test_umount_recovers_after_kill_9(source: Path, mounter: Mounter) -> None:
    mnt = mounter(source)
    (pid,) = daemon_pids(mnt)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(OSError) as caught:
        wait_until(lambda: not os.listdir(mnt))
    assert caught.value.errno in (errno.ENOTCONN, errno.ECONNABORTED)
    assert_one_line_error(run_cli("mount", source, mnt), "ckptfs umount")
    result = run_cli("umount", mnt)
    assert result.returncode == 0 and result.stderr == ""
    assert str(mnt) not in mount_points() and os.listdir(mnt) == []
    assert run_cli("mount", source, mnt).returncode == 0
    assert (mnt / "epoch").read_text() == "3\n"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signals_unmount_cleanly(source: Path, mounter: Mounter, signum: int) -> None:
    mnt = mounter.directory()
    daemon = subprocess.Popen([*CLI, "mount", "-f", str(source), str(mnt)], stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: str(mnt) in mount_points())
        assert (mnt / "epoch").read_text() == "3\n"
        daemon.send_signal(signum)
        assert daemon.wait(timeout=20) == 0
        assert daemon.stderr is not None and daemon.stderr.read() == ""
        assert str(mnt) not in mount_points()
    finally:
        daemon.kill()
        daemon.wait()


def test_debug_logs_requests_and_listings_carry_attributes(source: Path, mounter: Mounter) -> None:
    mnt = mounter.directory()
    daemon = subprocess.Popen([*CLI, "mount", "-f", "--debug", str(source), str(mnt)], stderr=subprocess.PIPE,
                              text=True)
    try:
        wait_until(lambda: str(mnt) in mount_points())
        os.listdir(mnt)
        subprocess.run(["ls", "-lR", str(mnt)], capture_output=True, check=True)
        assert run_cli("umount", mnt).returncode == 0
        assert daemon.wait(timeout=20) == 0
        assert daemon.stderr is not None
        log = daemon.stderr.read()
    finally:
        daemon.kill()
        daemon.wait()
    opcodes = re.findall(r"opcode: (\w+)", log)
    assert "READDIRPLUS" in opcodes and "GETATTR" in opcodes
    assert "callback" not in log.lower()  # mfusepy's set-up: a line per callback it installs
    # Every entry came with its attributes: ls -lR looked nothing up and asked no attributes again.
    assert "LOOKUP" not in opcodes[opcodes.index("READDIRPLUS"):], opcodes
    # The first open of a file or directory is answered ENOSYS: the kernel sends no other (no_open, no_opendir).
    assert opcodes.count("OPENDIR") <= 1 and opcodes.count("OPEN") <= 1 and "RELEASEDIR" not in opcodes, opcodes


def test_a_bad_read_is_eio_and_the_daemon_lives_on(tmp_path: Path, mounter: Mounter) -> None:
    good = save_zip({"bad": torch.arange(4096.0), "good": torch.ones(3)}, tmp_path / "good.pt")
    broken = tmp_path / "broken.pt"
    with zipfile.ZipFile(good) as zin, zipfile.ZipFile(broken, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info))
    with zipfile.ZipFile(broken) as z:
        record = next(i for i in z.infolist() if i.filename.endswith("data/0"))
    data = bytearray(broken.read_bytes())
    start = record.header_offset + 30 + len(record.filename.encode()) + len(record.extra)
    data[start + record.compress_size // 2 : start + record.compress_size // 2 + 8] = b"\xff" * 8
    broken.write_bytes(bytes(data))
    mnt = mounter.directory()
    daemon = subprocess.Popen([*CLI, "mount", "-f", str(broken), str(mnt)], stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: str(mnt) in mount_points())
        with pytest.raises(OSError) as caught:
            (mnt / "bad").read_bytes()
        assert caught.value.errno == errno.EIO
        assert (mnt / "good").read_bytes() == torch.ones(3).numpy().tobytes()
        assert run_cli("umount", mnt).returncode == 0
        assert daemon.wait(timeout=20) == 0
        assert daemon.stderr is not None and "bad" in daemon.stderr.read()
    finally:
        daemon.kill()
        daemon.wait()


def test_a_relative_source_is_recorded_absolute(tmp_path: Path, source: Path, mounter: Mounter) -> None:
    mnt = mounter.directory()
    result = subprocess.run([*CLI, "mount", source.name, os.path.relpath(mnt, tmp_path)], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stderr) == (0, "")
    listed = subprocess.run(["findmnt", "-n", "-o", "SOURCE,FSTYPE", "--mountpoint", str(mnt)], capture_output=True,
                            text=True, check=True).stdout.split()
    assert listed == [str(source), "fuse.ckptfs"]
    assert json.loads((mnt / ".ckptfs" / "index.json").read_text())["source"] == str(source)


def test_dev_fuse_without_permission_says_what_would_give_it() -> None:
    group = next(g for g in grp.getgrall() if g.gr_gid != 0)
    device = os.stat_result((stat.S_IFCHR | 0o660, 0, 0, 1, 0, group.gr_gid, 0, 0, 0, 0))
    assert device_access_problem("/dev/fuse", device) == (
        f"no permission to open /dev/fuse (mode crw-rw----, group {group.gr_name}): join group {group.gr_name} "
        f"(then log in again) or ask root to make it mode 0666 (the default of Debian's udev rules)")
    root_only_device = os.stat_result((stat.S_IFCHR | 0o600, 0, 0, 1, 0, 0, 0, 0, 0, 0))
    assert device_access_problem("/dev/fuse", root_only_device) == (
        "no permission to open /dev/fuse (mode crw-------, group root): "
        "ask root to make it mode 0666 (the default of Debian's udev rules)")


NO_FUSE_ACCESS = """
set -e
dir=$1 group=$2
shift 2
mknod -m 660 "$dir/fuse" c 10 229
chgrp "$group" "$dir/fuse"
mount --bind "$dir/fuse" /dev/fuse
exec "$@" "$dir/model.pt" "$dir/mnt"
"""


@root_only
def test_dev_fuse_without_permission_for_a_plain_user(shared_dir: Path) -> None:
    save_zip({"w": torch.ones(2)}, shared_dir / "model.pt")
    (shared_dir / "mnt").mkdir()
    group = next(g for g in grp.getgrall() if g.gr_gid != 0 and g.gr_gid != nobody().pw_gid)
    # In a mount namespace of its own, /dev/fuse is replaced by a node of mode 0660 owned by group `group`.
    argv = [*private_mount_namespace(), "sh", "-c", NO_FUSE_ACCESS, "sh", str(shared_dir), group.gr_name,
            *cli_as_user(nobody(), "mount")]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert_one_line_error(result, rf"^ckptfs: FUSE is not available: no permission to open /dev/fuse \(mode "
                                  rf"crw-rw----, group {group.gr_name}\): join group {group.gr_name} ")
    assert not mounted_under(shared_dir)
