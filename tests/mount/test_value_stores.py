"""Value files through a real mount, stored into the kernel's page cache as their directory is listed
(``fuse.page_store``) once a value file has been read: listed and nothing read, no page is cached (mincore of a
mapping of the file, which reads nothing); one value read, every small value file listed is cached before anything
reads it, and every file then reads the bytes torch's values give, on a read-only mount answering in one thread or
several; a file over a page is read as before; ``-o rw`` mounts read the same."""

from __future__ import annotations

import ctypes
import mmap
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from corpus import save_zip

from ckptfs.fuse.inodes import STORE_FILE_BYTES
from mount.helpers import Mounter, daemon_pids, force_unmount, mount_points, wait_until

BIG = "é" * STORE_FILE_BYTES
"""Its file is twice a page: not stored, read by READs."""

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]


def _cached(path: Path) -> bool:
    """Whether every page of the file is in the kernel's page cache; mapping it and asking reads nothing."""
    size = path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        address = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert address != ctypes.c_void_p(-1).value, os.strerror(ctypes.get_errno())
        try:
            pages = ctypes.create_string_buffer((size + mmap.PAGESIZE - 1) // mmap.PAGESIZE)
            assert _libc.mincore(address, size, pages) == 0, os.strerror(ctypes.get_errno())
            return all(page & 1 for page in pages.raw)
        finally:
            _libc.munmap(address, size)
    finally:
        os.close(fd)


def _expected(value: Any) -> bytes:
    """A value's file as docs/mount.md says (str, bytes, int, float, bool, None)."""
    if isinstance(value, bytes):
        return value
    return (value if isinstance(value, str) else repr(value)).encode() + b"\n"


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Many values of each plain kind, flat and nested as an optimizer's state is, and one value over a page."""
    kinds = [lambda i: i / 7, lambda i: f"step-{i}", lambda i: None, lambda i: bytes([i % 256]) * (i % 5 + 1),
             lambda i: i * 1_000_003, lambda i: i % 2 == 0, lambda i: "é" * (i % 9)]
    obj = {"flat": [kinds[i % len(kinds)](i) for i in range(700)],
           "state": {f"p{p}": {"lr": p / 3, "step": p, "name": f"layer.{p}", "none": None, "blob": b"\x00\n" * p}
                     for p in range(40)},
           "big": BIG, "epoch": 3}
    return save_zip(obj, tmp_path_factory.mktemp("stores") / "values.pt")


def _files(mnt: Path, loaded: dict[str, Any]) -> dict[Path, bytes]:
    files = {mnt / "flat" / str(i): _expected(v) for i, v in enumerate(loaded["flat"])}
    files |= {mnt / "state" / p / k: _expected(v) for p, state in loaded["state"].items() for k, v in state.items()}
    return files | {mnt / "big": _expected(BIG), mnt / "epoch": b"3\n"}


def _list_all(mnt: Path) -> set[Path]:
    """Every file, listed as find lists them (readdirplus); nothing read."""
    listed = subprocess.run(["find", str(mnt), "-type", "f", "-print0"], capture_output=True, check=True).stdout
    return {Path(name) for name in listed.decode().split("\0")[:-1]}


@pytest.mark.parametrize("args", [(), ("--multithreaded",)], ids=["one-thread", "multithreaded"])
def test_listed_value_files_are_cached_before_any_read_and_read_as_torch_wrote(source: Path, mounter: Mounter,
                                                                                args: tuple[str, ...]) -> None:
    loaded = torch.load(source, weights_only=False)  # made by this test: weights_only refuses bytes
    mnt = mounter(source, *args)
    files = _files(mnt, loaded)
    assert _list_all(mnt) == set(files) | {mnt / ".ckptfs" / "index.json"}
    small = [path for path, data in files.items() if 0 < len(data) <= STORE_FILE_BYTES]
    assert len(small) == len(files) - 1 - sum(not data for data in files.values())
    assert not any(_cached(path) for path in small)
    assert (mnt / "epoch").read_bytes() == b"3\n"
    wait_until(lambda: all(_cached(path) for path in small))
    assert not _cached(mnt / "big")
    names = sorted(files)
    read = subprocess.run(["cat", *map(str, names)], capture_output=True, check=True).stdout
    assert read == b"".join(files[name] for name in names)
    for path in names[::7]:
        assert path.read_bytes() == files[path], path


def test_a_read_write_mount_reads_the_same_bytes(source: Path, mounter: Mounter) -> None:
    loaded = torch.load(source, weights_only=False)
    mnt = mounter(source, "-o", "rw")
    files = _files(mnt, loaded)
    assert _list_all(mnt) >= set(files)
    names = sorted(files)
    read = subprocess.run(["cat", *map(str, names)], capture_output=True, check=True).stdout
    assert read == b"".join(files[name] for name in names)


def test_the_daemon_ends_when_unmounted_after_storing(source: Path, mounter: Mounter) -> None:
    mnt = mounter(source)
    _list_all(mnt)
    pids = daemon_pids(mnt)
    assert len(pids) == 1
    force_unmount(mnt)
    wait_until(lambda: not Path(f"/proc/{pids[0]}").exists()
               or Path(f"/proc/{pids[0]}/stat").read_text().split(") ")[1].startswith("Z"))


def test_a_signal_while_storing_and_reading_stops_the_daemon(tmp_path: Path, mounter: Mounter) -> None:
    """SIGTERM while the storing thread stores 20,000 files and a cat reads them: the daemon unmounts and ends (a
    store waiting for a page that a read holds is let go), the cat ends."""
    source = save_zip({"many": [i / 3 for i in range(20_000)]}, tmp_path / "many.pt")
    mnt = mounter(source)
    names = sorted(_list_all(mnt), key=lambda path: int(path.name) if path.parent.name == "many" else -1)
    (pid,) = daemon_pids(mnt)
    assert (mnt / "many" / "0").read_bytes() == b"0.0\n"  # the first value read: the listing is being stored
    reader = subprocess.Popen(["cat", *map(str, names[::-1])], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        os.kill(pid, signal.SIGTERM)
        wait_until(lambda: not Path(f"/proc/{pid}").exists()
                   or Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z"))
        assert str(mnt) not in mount_points()
        reader.wait(timeout=20)
    finally:
        reader.kill()
