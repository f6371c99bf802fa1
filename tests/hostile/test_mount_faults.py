"""Faults under a live mount: the source truncated, replaced or deleted; readers killed; busy unmounts."""

from __future__ import annotations

import errno
import os
import random
import signal
import struct
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path
from typing import Callable, Iterator

import pytest

from hostile.checks import assert_cli_error
from hostile.conftest import Runner
from hostile.containers import zip_checkpoint
from hostile.mounting import Mounts, daemon_serving, mount_points, wait_gone
from hostile.picklegen import dct, i, ints, pickle, s, storage_pid, tensor_v2

TENSORS = 8
SIZE = 256 << 10
BIG = 32 << 20
SIDE = 512


def _checkpoint(path: Path, big: bool = False) -> dict[str, bytes]:
    """Eight 256 KiB uint8 tensors in storage order, plus ``t7_t``: ``t7`` as 512×512, transposed (a strided read).

    Returns each tensor's expected bytes by name; ``big`` adds a 32 MiB tensor ``big`` at the end.
    """
    rng = random.Random(5)
    data = {str(k): rng.randbytes(SIZE) for k in range(TENSORS)}
    entries = [(s(f"t{k}"), tensor_v2(storage_pid("ByteStorage", str(k), SIZE), i(0), ints(SIZE), ints(1)))
               for k in range(TENSORS)]
    entries.append((s("t7_t"), tensor_v2(storage_pid("ByteStorage", str(TENSORS - 1), SIZE), i(0),
                                         ints(SIDE, SIDE), ints(1, SIDE))))
    if big:
        data["big"] = rng.randbytes(BIG)
        entries.append((s("big"), tensor_v2(storage_pid("ByteStorage", "big", BIG), i(0), ints(BIG), ints(1))))
    path.write_bytes(zip_checkpoint(pickle(dct(*entries)), data))
    expected = {f"t{k}": data[str(k)] for k in range(TENSORS)}
    last = data[str(TENSORS - 1)]
    expected["t7_t"] = bytes(last[c * SIDE + r] for r in range(SIDE) for c in range(SIDE))
    if big:
        expected["big"] = data["big"]
    return expected


def _record_offset(path: Path, key: str) -> int:
    with zipfile.ZipFile(path) as z:
        info = z.getinfo(f"archive/data/{key}")
    return info.header_offset


def _background_mount(runner: Runner, mounts: Mounts, source: Path) -> tuple[Path, int]:
    mnt = mounts.directory()
    result = runner.run("mount", source, mnt)
    assert result.rc == 0, result.stderr
    daemon = daemon_serving(source)
    mounts.daemons.add(daemon)
    return mnt, daemon


Start = Callable[[Path], tuple[Path, "subprocess.Popen[str]"]]


@pytest.fixture
def foreground(fuse: None, mounts: Mounts) -> Iterator[Start]:
    """Mounts with ``ckptfs mount -f`` so the daemon's log (its stderr) can be read; always taken down."""
    started: list[subprocess.Popen[str]] = []

    def start(source: Path) -> tuple[Path, subprocess.Popen[str]]:
        mnt = mounts.directory()
        proc = subprocess.Popen([sys.executable, "-m", "ckptfs.cli", "mount", "-f", str(source), str(mnt)],
                                stderr=subprocess.PIPE, text=True)
        started.append(proc)
        deadline = time.monotonic() + 20
        while str(mnt) not in mount_points():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "the foreground mount did not come up"
            time.sleep(0.01)
        return mnt, proc

    try:
        yield start
    finally:
        mounts.cleanup()
        for proc in started:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _read(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _eio(path: Path) -> None:
    with pytest.raises(OSError) as info:
        _read(path)
    assert info.value.errno == errno.EIO


def test_truncated_source_gives_eio_beyond_the_end_and_logs_it(foreground: Start, tmp_path: Path) -> None:
    source = tmp_path / "ck.pt"
    expected = _checkpoint(source)
    mnt, proc = foreground(source)
    assert _read(mnt / "t0") == expected["t0"]
    os.truncate(source, _record_offset(source, "6") + 100)  # t6 keeps its first 56 bytes
    for name in ("t6", "t7", "t7_t"):
        _eio(mnt / name)
    for k in range(6):
        assert _read(mnt / f"t{k}") == expected[f"t{k}"]
    assert (mnt / "t0.json").stat().st_size > 0
    subprocess.run(["fusermount3", "-u", str(mnt)], check=True)
    _, log = proc.communicate(timeout=20)
    assert proc.returncode == 0, log
    for name in ("t6", "t7", "t7_t"):
        assert f"/{name}: " in log and "truncated" in log, log


def test_local_header_disagreeing_with_the_directory_gives_eio_and_logs_it(foreground: Start, tmp_path: Path) -> None:
    """torch's data offsets are computed at open; a local header that puts a record's data elsewhere fails its
    reads, never serving the computed bytes."""
    import torch

    source = tmp_path / "ck.pt"
    tensors = {f"t{k}": torch.full((1000,), k, dtype=torch.int32) for k in range(4)}
    torch.save(tensors, source)
    with zipfile.ZipFile(source) as z:
        header = z.getinfo("ck/data/1").header_offset
    with open(source, "r+b") as f:
        f.seek(header + 28)
        f.write(struct.pack("<H", 4))
    mnt, proc = foreground(source)
    _eio(mnt / "t1")
    for k in (0, 2, 3):
        assert _read(mnt / f"t{k}") == tensors[f"t{k}"].numpy().tobytes()
    subprocess.run(["fusermount3", "-u", str(mnt)], check=True)
    _, log = proc.communicate(timeout=20)
    assert proc.returncode == 0, log
    assert "/t1: " in log and "local header of zip record 'ck/data/1'" in log and "disagrees" in log, log


def test_truncated_source_background_daemon_stays_up(runner: Runner, mounts: Mounts, tmp_path: Path) -> None:
    source = tmp_path / "ck.pt"
    expected = _checkpoint(source)
    mnt, daemon = _background_mount(runner, mounts, source)
    os.truncate(source, _record_offset(source, "3") + 100)
    for _ in range(3):
        for k in range(TENSORS):
            if k < 3:
                assert _read(mnt / f"t{k}") == expected[f"t{k}"]
            else:
                _eio(mnt / f"t{k}")
    assert os.path.exists(f"/proc/{daemon}") and str(mnt) in mount_points()


@pytest.mark.parametrize("change", ["replaced", "deleted", "overwritten_by_rename"])
def test_source_replaced_or_deleted_keeps_serving_the_opened_file(change: str, runner: Runner, mounts: Mounts,
                                                                   tmp_path: Path) -> None:
    source = tmp_path / "ck.pt"
    expected = _checkpoint(source)
    mnt, _ = _background_mount(runner, mounts, source)
    if change == "deleted":
        source.unlink()
    elif change == "replaced":
        source.unlink()
        source.write_bytes(b"not a checkpoint any more")
    else:
        other = tmp_path / "other.pt"
        other.write_bytes(os.urandom(source.stat().st_size))
        os.replace(other, source)
    for name, data in expected.items():
        assert _read(mnt / name) == data


def test_reader_killed_mid_read(runner: Runner, mounts: Mounts, tmp_path: Path) -> None:
    source = tmp_path / "ck.pt"
    expected = _checkpoint(source, big=True)
    mnt, daemon = _background_mount(runner, mounts, source)
    reader = ("import sys\nf = open(sys.argv[1], 'rb', buffering=0)\nprint('reading', flush=True)\n"
              "while True:\n    f.seek(0)\n    while f.read(1 << 16):\n        pass\n")
    for _ in range(5):
        proc = subprocess.Popen([sys.executable, "-c", reader, str(mnt / "big")], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline() == "reading\n"
        time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert _read(mnt / "big") == expected["big"]
    assert os.path.exists(f"/proc/{daemon}")
    assert _read(mnt / "t7_t") == expected["t7_t"]


def test_many_readers_open_and_close_the_same_file(runner: Runner, mounts: Mounts, tmp_path: Path) -> None:
    source = tmp_path / "ck.pt"
    expected = _checkpoint(source)
    mnt, daemon = _background_mount(runner, mounts, source)
    fds_before = _files_open(daemon)
    errors: list[BaseException] = []

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(150):
                name = rng.choice(("t3", "t7_t"))
                offset, size = rng.randrange(SIZE), rng.randrange(1, 65536)
                with open(mnt / name, "rb") as f:
                    f.seek(offset)
                    assert f.read(size) == expected[name][offset : offset + size]
        except BaseException as exc:  # noqa: BLE001 - collected and re-raised in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert _files_open(daemon) == fds_before


def _files_open(pid: int) -> list[str]:
    """What the process has open, but pipes: libfuse makes one per FUSE thread for its first spliced reply."""
    links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    return sorted(link for link in links if not link.startswith("pipe:"))


def test_unmount_while_a_file_is_open(runner: Runner, mounts: Mounts, tmp_path: Path) -> None:
    source = tmp_path / "ck.pt"
    expected = _checkpoint(source)
    mnt, daemon = _background_mount(runner, mounts, source)
    with open(mnt / "t1", "rb") as held:
        busy = runner.run("umount", mnt)
        assert_cli_error(busy, mnt, r"cannot unmount: .*busy.*ckptfs umount -l")
        assert str(mnt) in mount_points()
        assert held.read() == expected["t1"]
    assert runner.run("umount", mnt).rc == 0
    wait_gone(daemon)
    assert str(mnt) not in mount_points()


def test_lazy_unmount_detaches_now_and_ends_when_the_last_file_closes(runner: Runner, mounts: Mounts,
                                                                       tmp_path: Path) -> None:
    source = tmp_path / "ck.pt"
    expected = _checkpoint(source)
    mnt, daemon = _background_mount(runner, mounts, source)
    held = open(mnt / "t2", "rb")
    try:
        result = runner.run("umount", "-l", mnt)
        assert result.rc == 0 and result.stderr == "", result.stderr
        assert str(mnt) not in mount_points()
        assert held.read() == expected["t2"]
        assert os.path.exists(f"/proc/{daemon}")
    finally:
        held.close()
    wait_gone(daemon)
