"""``ckptfs mount -o rw``: skip_data skeletons filled through a real mount by real programs, then checked by torch."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from corpus import torch_bytes
from remote_servers import Nginx, nginx  # noqa: F401  (fixture)

from mount.helpers import Mounter, daemon_pids, mount_points, run_cli, wait_until
from mount.users import IS_ROOT

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "writing"))
from skeletons import assert_crcs_verify, assert_loads_equal, crcs, save_skeleton, sha256, state  # noqa: E402
from test_write_api import REFUSED  # noqa: E402


def _bins(tmp_path: Path) -> dict[str, Path]:
    """Each contiguous tensor of ``state()`` as a file of its bytes (what a program writing it has)."""
    out = {}
    tensors = state()
    tensors["bf"] = tensors.pop("nested")["bf"]
    for key, tensor in tensors.items():
        if tensor.is_contiguous():
            out[key] = tmp_path / f"{key}.bin"
            out[key].write_bytes(torch_bytes(tensor))
    return out


def _umount(mnt: Path) -> None:
    result = run_cli("umount", mnt)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert str(mnt) not in mount_points()


def test_dd_python_pwrite_and_numpy_fill_a_skeleton_that_torch_then_loads(tmp_path: Path, mounter: Mounter) -> None:
    path = save_skeleton(tmp_path / "skel.pt")
    bins = _bins(tmp_path)
    mnt = mounter(path, "-o", "rw")
    subprocess.run(["dd", f"if={bins['big']}", f"of={mnt / 'big'}", "bs=1M", "conv=notrunc", "status=none"],
                   check=True)
    with open(mnt / "w", "r+b") as f:
        f.write(bins["w"].read_bytes())
    fd = os.open(mnt / "ids", os.O_WRONLY)
    try:
        data = bins["ids"].read_bytes()
        assert os.pwrite(fd, data[24:], 24) == len(data) - 24 and os.pwrite(fd, data[:24], 0) == 24
    finally:
        os.close(fd)
    h = np.memmap(mnt / "h", dtype=np.float16, mode="r+", shape=(300,))
    h[:] = state()["h"].numpy()
    h.flush()
    del h
    with open(mnt / "b", "r+b") as f:
        f.write(bins["b"].read_bytes())
    subprocess.run(["dd", f"if={bins['bf']}", f"of={mnt / 'nested' / 'bf'}", "conv=notrunc", "status=none"],
                   check=True)
    assert (mnt / "big").read_bytes() == bins["big"].read_bytes()  # read back through the mount
    _umount(mnt)  # CRCs are set and the file synced by the time umount returns
    assert_loads_equal(path)
    assert_crcs_verify(path)
    info = json.loads(run_cli("info", "--json", path).stdout)
    assert all(storage["written"] for storage in info["storages"])
    again = mounter(path)
    assert json.loads((again / "big.json").read_bytes())["storage"]["written"] is True


def test_crcs_are_set_when_the_writing_program_closes_the_file(tmp_path: Path, mounter: Mounter) -> None:
    path = save_skeleton(tmp_path / "skel.pt")
    before = crcs(path)
    mnt = mounter(path, "-o", "rw")
    data = torch_bytes(state()["big"])
    with open(mnt / "big", "r+b") as f:
        f.write(data[:1000])
    assert crcs(path) == before  # part of a record: unwritten still
    with open(mnt / "big", "r+b") as f:
        f.seek(1000)
        f.write(data[1000:])
    changed = {name for name, crc in crcs(path).items() if crc != before[name]}
    assert len(changed) == 1 and crcs(path)[changed.pop()] == __import__("zlib").crc32(data)
    _umount(mnt)


def test_a_sidecar_says_written_once_the_record_is_whole_and_keeps_its_size(tmp_path: Path,
                                                                            mounter: Mounter) -> None:
    path = save_skeleton(tmp_path / "skel.pt")
    mnt = mounter(path, "-o", "rw")
    sidecar = mnt / "big.json"
    listed = {entry.name: entry.stat().st_size for entry in os.scandir(mnt)}
    before = sidecar.read_bytes()
    assert json.loads(before)["storage"]["written"] is False and len(before) == listed["big.json"]
    data = torch_bytes(state()["big"])
    with open(mnt / "big", "r+b") as f:
        f.write(data[:1000])
    assert json.loads(sidecar.read_bytes())["storage"]["written"] is False  # part of the record only
    with open(mnt / "big", "r+b") as f:
        f.seek(1000)
        f.write(data[1000:])
    after = sidecar.read_bytes()
    assert json.loads(after)["storage"]["written"] is True
    assert after == before.replace(b'"written": false', b'"written":  true')
    assert sidecar.stat().st_size == len(after) == listed["big.json"]
    assert subprocess.run(["cat", str(sidecar)], capture_output=True, check=True).stdout == after
    assert {entry.name: entry.stat().st_size for entry in os.scandir(mnt)} == listed
    _umount(mnt)
    info = json.loads(run_cli("info", "--json", path).stdout)
    assert [s["written"] for s in info["storages"] if s["nbytes"] == len(data)] == [True]


def test_writes_past_the_end_fail_with_efbig_and_change_nothing(tmp_path: Path, mounter: Mounter) -> None:
    path = save_skeleton(tmp_path / "skel.pt")
    before = sha256(path)
    mnt = mounter(path, "-o", "rw")
    fd = os.open(mnt / "h", os.O_WRONLY)
    try:
        with pytest.raises(OSError) as caught:
            os.pwrite(fd, b"x" * 10, 595)
        assert caught.value.errno == errno.EFBIG
    finally:
        os.close(fd)
    result = subprocess.run(["dd", "if=/dev/zero", f"of={mnt / 'h'}", "bs=1k", "count=1", "conv=notrunc"],
                            capture_output=True, text=True)
    assert result.returncode == 1 and "File too large" in result.stderr
    _umount(mnt)
    assert sha256(path) == before


CHANGES = {
    "create": lambda mnt: open(mnt / "new", "wb"),
    "unlink": lambda mnt: os.unlink(mnt / "h"),
    "rename": lambda mnt: os.rename(mnt / "h", mnt / "h2"),
    "mkdir": lambda mnt: os.mkdir(mnt / "d"),
    "truncate": lambda mnt: os.truncate(mnt / "h", 0),
    "open with O_TRUNC": lambda mnt: open(mnt / "h", "wb"),
    "chmod": lambda mnt: os.chmod(mnt / "h", 0o600),
    "utime": lambda mnt: os.utime(mnt / "h", (0, 0)),
    "sidecar": lambda mnt: open(mnt / "h.json", "r+b"),
    "npy view": lambda mnt: open(mnt / "h.npy", "r+b"),
    "index": lambda mnt: open(mnt / ".ckptfs" / "index.json", "r+b"),
    "safetensors view": lambda mnt: open(mnt / "model.safetensors", "r+b"),
    "non-contiguous tensor": lambda mnt: open(mnt / "wt", "r+b"),
    "symlink": lambda mnt: os.symlink("h", mnt / "l"),
}


def test_everything_else_is_read_only(tmp_path: Path, mounter: Mounter) -> None:
    path = save_skeleton(tmp_path / "skel.pt")
    before = sha256(path)
    mnt = mounter(path, "-o", "rw")
    for name, change in CHANGES.items():
        with pytest.raises(OSError) as caught:
            change(mnt)
        assert caught.value.errno == errno.EROFS, name
    _umount(mnt)
    assert sha256(path) == before


@pytest.mark.parametrize("kind", REFUSED)
def test_mount_rw_refuses_what_cannot_be_written_in_one_line(kind: str, tmp_path: Path, mounter: Mounter) -> None:
    make, reason = REFUSED[kind]
    path = make(tmp_path / kind)
    source = path.parent if kind == "dcp" else path
    before = sha256(path)
    mnt = mounter.directory()
    result = run_cli("mount", "-o", "rw", source, mnt)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"ckptfs: {source}: cannot be opened for writing: ")
    assert __import__("re").search(reason, result.stderr)
    assert str(mnt) not in mount_points() and sha256(path) == before


def test_mount_rw_refuses_a_url(tmp_path: Path, mounter: Mounter, nginx: Nginx) -> None:  # noqa: F811
    path = save_skeleton(nginx.root / "rw-skel.pt")
    before = sha256(path)
    result = run_cli("mount", "-o", "rw", f"{nginx.url}/rw-skel.pt", mounter.directory())
    assert result.returncode == 1, result.stderr
    assert result.stderr == (f"ckptfs: {nginx.url}/rw-skel.pt: cannot be opened for writing: not a local file "
                             "(a URL or a file object): only a local file is written in place\n")
    assert sha256(path) == before


def test_parallel_writers_through_one_mount_lose_no_bytes(tmp_path: Path, mounter: Mounter) -> None:
    """Processes writing different tensors, and different ranges of one tensor, at once."""
    path = save_skeleton(tmp_path / "skel.pt")
    bins = _bins(tmp_path)
    mnt = mounter(path, "-o", "rw", "--multithreaded")
    big = bins["big"].read_bytes()
    step = len(big) // 8
    jobs = [["dd", f"if={bins['big']}", f"of={mnt / 'big'}", "bs=4k", f"skip={i * step // 4096}",
             f"seek={i * step // 4096}", f"count={step // 4096}", "conv=notrunc", "status=none"] for i in range(8)]
    jobs += [["dd", f"if={bins[key]}", f"of={mnt / key}", "conv=notrunc", "status=none"]
             for key in ("w", "ids", "h", "b")]
    jobs.append(["sh", "-c", f"cat {bins['bf']} | dd of={mnt / 'nested' / 'bf'} conv=notrunc status=none"])
    assert len(big) % (8 * 4096) == 0
    with ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(lambda argv: subprocess.run(argv, capture_output=True, text=True), jobs))
    assert [(r.returncode, r.stderr) for r in results] == [(0, "")] * len(jobs)
    _umount(mnt)
    assert_loads_equal(path)
    assert_crcs_verify(path)


def test_a_killed_daemon_leaves_a_valid_archive_and_a_new_mount_finishes(tmp_path: Path, mounter: Mounter) -> None:
    path = save_skeleton(tmp_path / "skel.pt")
    bins = _bins(tmp_path)
    mnt = mounter(path, "-o", "rw")
    for key in ("w", "ids", "h", "b"):
        subprocess.run(["dd", f"if={bins[key]}", f"of={mnt / key}", "conv=notrunc", "status=none"], check=True)
    writer = subprocess.Popen(["dd", "if=/dev/urandom", f"of={mnt / 'big'}", "bs=4k", "conv=notrunc",
                               "status=none"], stderr=subprocess.DEVNULL)
    wait_until(lambda: os.path.getsize(path) > 0 and _written_some(mnt))
    (pid,) = daemon_pids(mnt)
    os.kill(pid, signal.SIGKILL)  # in the middle of dd's writes
    writer.wait(timeout=30)
    wait_until(lambda: not os.path.exists(f"/proc/{pid}"))
    assert run_cli("umount", mnt).returncode == 0
    loaded = torch.load(path, weights_only=True)  # a valid archive: torch reads it
    assert torch.equal(loaded["w"], state()["w"])
    with __import__("zipfile").ZipFile(path) as archive:  # and zip tools: every CRC set is right
        bad = archive.testzip()
        assert bad is None or crcs(path)[bad.split("/", 1)[1]] == 0
    again = mounter(path, "-o", "rw")
    subprocess.run(["dd", f"if={bins['big']}", f"of={again / 'big'}", "bs=1M", "conv=notrunc", "status=none"],
                   check=True)
    subprocess.run(["dd", f"if={bins['bf']}", f"of={again / 'nested' / 'bf'}", "conv=notrunc", "status=none"],
                   check=True)
    _umount(again)
    assert_loads_equal(path)
    assert_crcs_verify(path)


def _written_some(mnt: Path) -> bool:
    with open(mnt / "big", "rb") as f:
        return f.read(4096) != b"\0" * 4096


@pytest.mark.skipif(IS_ROOT, reason="root writes whatever the mode bits say")
def test_a_file_the_user_cannot_write_is_refused(tmp_path: Path, mounter: Mounter) -> None:
    path = save_skeleton(tmp_path / "skel.pt")
    path.chmod(0o444)
    result = run_cli("mount", "-o", "rw", path, mounter.directory())
    assert result.returncode == 1
    assert result.stderr == f"ckptfs: {path}: cannot open for writing: Permission denied\n"


def test_a_second_rw_mount_of_the_same_file_is_refused(tmp_path: Path, mounter: Mounter) -> None:
    path = save_skeleton(tmp_path / "skel.pt")
    mounter(path, "-o", "rw")
    result = run_cli("mount", "-o", "rw", path, mounter.directory())
    assert result.returncode == 1
    assert result.stderr == (f"ckptfs: {path}: already open for writing (by a -o rw mount or "
                             "ckptfs.open(mode='r+'))\n")
    mounter(path)  # read-only mounts are not kept out


def test_rw_and_ro_options() -> None:
    from ckptfs.fuse.mount_options import MountOptions, with_options

    assert with_options(MountOptions(), ["rw"]).rw is True
    assert with_options(MountOptions(), ["rw,ro"]).rw is False
    assert with_options(MountOptions(), ["ro"]).rw is False
    assert with_options(MountOptions(), ["rw"], rw_as_ro=True).rw is False  # mount(8) passes rw unless told ro
