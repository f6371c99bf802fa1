"""``ckptfs umount``: several at once, through a symlink, busy, and another user's mount."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import torch
from corpus import save_zip

from ckptfs.fuse.unmount import BUSY_HINT, explain
from mount.helpers import Mounter, mount_points, run_cli
from mount.test_lifecycle import assert_one_line_error
from mount.users import cli_as_user, nobody, root_only

pytestmark = pytest.mark.mount


@pytest.fixture
def source(tmp_path: Path) -> Path:
    return save_zip({"m": {"w": torch.arange(6.0)}, "epoch": 3}, tmp_path / "model.pt")


def test_several_at_once_each_problem_one_line_the_others_unmounted(tmp_path: Path, source: Path,
                                                                   mounter: Mounter) -> None:
    first, second = mounter(source), mounter(source)
    idle = mounter.directory()
    result = run_cli("umount", first, idle, tmp_path / "absent", second)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.splitlines() == [f"ckptfs: {idle}: not mounted", f"ckptfs: {tmp_path}/absent: does not exist"]
    assert not {str(first), str(second)} & set(mount_points())
    assert os.listdir(first) == os.listdir(second) == []


def test_several_at_once_all_fine(source: Path, mounter: Mounter) -> None:
    mounts = [mounter(source) for _ in range(3)]
    result = run_cli("umount", *mounts)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    assert not {str(mnt) for mnt in mounts} & set(mount_points())


def test_a_symlinked_mount_point_mounts_at_its_target_and_unmounts_by_the_link(tmp_path: Path, source: Path,
                                                                             mounter: Mounter) -> None:
    real = mounter.directory()
    link = tmp_path / "link"
    link.symlink_to(real)
    result = run_cli("mount", source, link)
    assert (result.returncode, result.stderr) == (0, "")
    assert mount_points().get(str(real)) == "fuse.ckptfs" and str(link) not in mount_points()
    assert (link / "epoch").read_text() == "3\n"
    assert_one_line_error(run_cli("mount", source, link), rf"^ckptfs: {real}: already a mount point$")
    result = run_cli("umount", link)
    assert (result.returncode, result.stderr) == (0, "")
    assert str(real) not in mount_points()
    assert_one_line_error(run_cli("umount", link), rf"^ckptfs: {real}: not mounted$")


def test_busy_because_a_process_works_in_it(source: Path, mounter: Mounter) -> None:
    mnt = mounter(source)
    shell = subprocess.Popen(["sleep", "60"], cwd=mnt / "m")
    try:
        assert_one_line_error(run_cli("umount", mnt), rf"^ckptfs: {mnt}: cannot unmount: {re.escape(BUSY_HINT)}$")
        assert (mnt / "epoch").read_text() == "3\n"
    finally:
        shell.kill()
        shell.wait()
    result = run_cli("umount", mnt)
    assert (result.returncode, result.stderr) == (0, "")


@root_only
def test_another_users_mount_says_whose_it_is(shared_dir: Path) -> None:
    source = save_zip({"w": torch.ones(2)}, shared_dir / "model.pt")
    mounter = Mounter(shared_dir / "mnt")
    try:
        mnt = mounter(source)
        result = subprocess.run(cli_as_user(nobody(), "umount", mnt), capture_output=True, text=True)
        assert_one_line_error(result, rf"^ckptfs: {mnt}: cannot unmount: another user's mount \(root, uid 0\); "
                                      r"only that user or root can unmount it$")
        assert str(mnt) in mount_points()
    finally:
        mounter.cleanup()


RECORDED = {
    # fusermount3 3.14, run by uid 1000 on a mount of uid 0
    "fusermount3: entry for /mnt/m not found in /etc/mtab": (0, 1000, "another user's mount (root, uid 0); "
                                                                      "only that user or root can unmount it"),
    "fusermount3: failed to unmount /mnt/m: Device or resource busy": (1000, 1000, BUSY_HINT),
    "umount: /mnt/m: target is busy.": (0, 0, BUSY_HINT),
    "fusermount3: failed to unmount /mnt/m: Invalid argument": (
        1000, 1000, "fusermount3: failed to unmount /mnt/m: Invalid argument"),
}


@pytest.mark.parametrize("stderr", RECORDED)
def test_the_tools_complaints_name_their_cause(stderr: str) -> None:
    owner, uid, expected = RECORDED[stderr]
    assert explain(stderr, owner, uid) == expected


def test_an_unknown_owner_is_named_by_number() -> None:
    assert explain("fusermount3: entry for /m not found in /etc/mtab", 4000000, 1000) == (
        "another user's mount (uid 4000000); only that user or root can unmount it")
