"""``mount.ckptfs``: called as mount(8) calls it, and (as root) through mount(8) itself, /etc/fstab lines and all."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
import torch
from corpus import save_zip
from many_tensors import save_many, small_zips_cached  # noqa: F401  (fixture)

import ckptfs.cache

from mount.helpers import Mounter, mount_points, run_cli, wait_until
from mount.test_lifecycle import mounted_under
from mount.users import findmnt, root_only

pytestmark = pytest.mark.mount

HELPER = Path(sys.executable).parent / "mount.ckptfs"
"""The console script pip installed beside the interpreter."""
SBIN = (Path("/sbin/mount.ckptfs"), Path("/sbin/mount.fuse.ckptfs"))
W = torch.arange(10, dtype=torch.int16)


@pytest.fixture
def source(tmp_path: Path) -> Path:
    return save_zip({"w": W, "epoch": 3}, tmp_path / "model.pt")


def helper(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(HELPER), *map(str, args)], capture_output=True, text=True, timeout=60, env=env)


def assert_mounted_read_only(mnt: Path, source: Path) -> None:
    entry = findmnt(mnt)
    assert (entry["source"], entry["fstype"]) == (str(source), "fuse.ckptfs")
    assert "ro" in entry["vfs-options"].split(",")
    assert (mnt / "w").read_bytes() == W.numpy().tobytes()


def test_the_helper_is_installed_beside_ckptfs() -> None:
    assert HELPER.is_file() and os.access(HELPER, os.X_OK), f"{HELPER}: pip install -e . makes it"


@pytest.mark.parametrize("flags", [
    ("-o", "rw"),  # what mount(8) passes when the line says nothing
    ("-n", "-v", "-o", "ro,nofail,_netdev,noexec,nosuid,nodev,user"),
    ("-r",),
    ("-w", "-t", "fuse.ckptfs"),
    ("-o", "defaults", "-s", "-o", "ro,some_other_fs_option=1"),
], ids=" ".join)
def test_argv_as_mount8_passes_it(source: Path, mounter: Mounter, flags: tuple[str, ...]) -> None:
    mnt = mounter.directory()
    result = helper(source, mnt, *flags)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    assert_mounted_read_only(mnt, source)


@pytest.mark.usefixtures("small_zips_cached")
@pytest.mark.parametrize("options", ["", "cache_dir=DIR", "nocache", "cache_dir=DIR,nocache"])
def test_the_cache_folder_as_options_say(tmp_path: Path, mounter: Mounter, options: str) -> None:
    """The parse is cached as ckptfs mount caches it: in -o cache_dir=DIR, nowhere with -o nocache, else in the
    user's cache folder."""
    many = save_many(tmp_path / "many.pt", ckptfs.cache.MIN_TENSORS + 10)
    chosen, home = tmp_path / "chosen", tmp_path / "xdg"
    flags = ("-o", options.replace("DIR", str(chosen))) if options else ()
    mnt = mounter.directory()
    result = helper(many, mnt, *flags, env={**os.environ, "XDG_CACHE_HOME": str(home)})
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    assert len(list(mnt.iterdir())) > ckptfs.cache.MIN_TENSORS

    def cached() -> dict[Path, int]:
        return {folder: len(list((folder / "metadata").glob("*.ckm"))) for folder in (chosen, home / "ckptfs")
                if folder.exists()}

    expected = {"": {home / "ckptfs": 1}, "cache_dir=DIR": {chosen: 1}}.get(options, {})
    wait_until(lambda: cached() == expected)  # an entry is written by a process of its own once mounted


def test_an_unusable_cache_dir_is_one_warning_and_the_mount_goes_on(tmp_path: Path, source: Path,
                                                                    mounter: Mounter) -> None:
    (tmp_path / "a-file").write_bytes(b"")
    mnt = mounter.directory()
    result = helper(source, mnt, "-o", f"ro,cache_dir={tmp_path}/a-file")
    assert (result.returncode, result.stdout) == (0, "")
    assert result.stderr.splitlines() == [f"ckptfs: warning: -o cache_dir={tmp_path}/a-file is unusable: cache "
                                          f"folder {tmp_path}/a-file/metadata: Not a directory; going on without "
                                          "the cache"]
    assert_mounted_read_only(mnt, source)


def test_fake_mounts_nothing(tmp_path: Path, source: Path) -> None:
    (tmp_path / "mnt").mkdir()
    result = helper(source, tmp_path / "mnt", "-f", "-o", "ro,allow_other")
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    assert not mounted_under(tmp_path)


FAILURES = {
    ("-o", "ro,frobnicate"): (32, "ckptfs: -o frobnicate: unknown mount option (ckptfs mount --help lists them)"),
    ("-N", "/proc/1/ns/mnt"): (32, "ckptfs: -N /proc/1/ns/mnt: mounting in another mount namespace is not supported"),
    ("-o", "uid=no-such-user-here"): (32, "ckptfs: -o uid=no-such-user-here: no such user"),
}


@pytest.mark.parametrize("flags", FAILURES, ids=" ".join)
def test_a_failure_is_one_line_and_status_32(tmp_path: Path, source: Path, flags: tuple[str, ...]) -> None:
    (tmp_path / "mnt").mkdir()
    result = helper(source, tmp_path / "mnt", *flags)
    assert (result.returncode, result.stdout, result.stderr.splitlines()) == (FAILURES[flags][0], "",
                                                                             [FAILURES[flags][1]])
    assert not mounted_under(tmp_path)


def test_a_missing_source_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "mnt").mkdir()
    result = helper(tmp_path / "absent.pt", tmp_path / "mnt")
    assert result.returncode == 32 and result.stdout == ""
    assert result.stderr.splitlines() == [f"ckptfs: {tmp_path}/absent.pt: cannot open: No such file or directory"]


def test_bad_usage_is_one_line_and_status_1(tmp_path: Path) -> None:
    result = helper(tmp_path / "model.pt")
    assert result.returncode == 1 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("mount.ckptfs: the following arguments are required: MOUNTPOINT (usage: mount.ckptfs ")


@pytest.fixture
def installed_helper() -> Iterator[None]:
    """/sbin/mount.ckptfs and /sbin/mount.fuse.ckptfs linked to this checkout's helper, as the README installs them;
    whatever was there before is put back."""
    saved = {}
    for path in SBIN:
        if path.exists() and not path.is_symlink():
            pytest.fail(f"{path} is a file, not a link this test could put back")
        saved[path] = os.readlink(path) if path.is_symlink() else None
    try:
        for path in SBIN:
            path.unlink(missing_ok=True)
            path.symlink_to(HELPER)
        yield
    finally:
        for path, target in saved.items():
            path.unlink(missing_ok=True)
            if target is not None:
                path.symlink_to(target)


def mount8(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *map(str, args)], capture_output=True, text=True, timeout=60)


@root_only
@pytest.mark.parametrize("fstype", ["ckptfs", "fuse.ckptfs"])
def test_mount_t_through_mount8(installed_helper: None, source: Path, mounter: Mounter, fstype: str) -> None:
    mnt = mounter.directory()
    result = mount8("-t", fstype, source, mnt, "-o", "ro")
    assert (result.returncode, result.stderr) == (0, "")
    assert_mounted_read_only(mnt, source)
    result = subprocess.run(["umount", str(mnt)], capture_output=True, text=True)
    assert (result.returncode, result.stderr) == (0, "")
    assert str(mnt) not in mount_points()


README = Path(__file__).resolve().parents[2] / "docs" / "mount.md"


def readme_fstab_line() -> str:
    (line,) = re.findall(r"^/data/model\.pt +/mnt/m +ckptfs +\S+ +0 0$", README.read_text(), re.MULTILINE)
    return line


@root_only
def test_the_readmes_fstab_line(installed_helper: None, tmp_path: Path, source: Path, mounter: Mounter) -> None:
    mnt = mounter.directory()
    fstab = tmp_path / "fstab"
    fstab.write_text(readme_fstab_line().replace("/data/model.pt", str(source)).replace("/mnt/m", str(mnt)) + "\n")
    result = mount8("--fstab", fstab, mnt)
    assert (result.returncode, result.stderr) == (0, "")
    assert_mounted_read_only(mnt, source)
    assert "allow_other" in findmnt(mnt)["fs-options"].split(",")
    result = run_cli("umount", mnt)
    assert (result.returncode, result.stderr) == (0, "")


@root_only
def test_mount8_passes_the_helpers_error_on(installed_helper: None, tmp_path: Path) -> None:
    (tmp_path / "mnt").mkdir()
    result = mount8("-t", "ckptfs", tmp_path / "absent.pt", tmp_path / "mnt")
    assert result.returncode == 32
    assert f"ckptfs: {tmp_path}/absent.pt: cannot open: No such file or directory" in result.stderr.splitlines()
    assert not mounted_under(tmp_path)


def test_the_readmes_systemd_unit_is_valid(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is missing (no systemd here)")
    (unit,) = re.findall(r"```ini\n(.*?)```", README.read_text(), re.DOTALL)
    assert "Where=/mnt/m\n" in unit and "Type=ckptfs\n" in unit
    (tmp_path / "mnt-m.mount").write_text(unit)
    result = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "mnt-m.mount")], capture_output=True,
                            text=True)
    assert (result.returncode, result.stderr) == (0, "")
