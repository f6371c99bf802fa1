"""``ckptfs mount -o …``, ``--uid``/``--gid``: each option through a real mount, checked with stat and findmnt."""

from __future__ import annotations

import grp
import os
import signal
import stat
import subprocess
from pathlib import Path

import pytest
import torch
from corpus import save_zip

from mount.helpers import CLI, Mounter, daemon_pids, mount_points, run_cli, wait_until
from mount.test_lifecycle import assert_one_line_error, mounted_under
from mount.users import IS_ROOT, as_user, cli_as_user, findmnt, nobody, private_mount_namespace, root_only

pytestmark = pytest.mark.mount

W = torch.arange(12.0).reshape(3, 4)


@pytest.fixture
def source(tmp_path: Path) -> Path:
    return save_zip({"m": {"w": W, "tied": W}, "epoch": 3}, tmp_path / "model.pt")


ENTRIES = ("", "m", "m/w", "m/w.json", "epoch", ".ckptfs/index.json", "m/tied")


def _owners_and_modes(mnt: Path) -> tuple[set[tuple[int, int]], dict[str, int]]:
    found = {path: os.lstat(mnt / path) for path in ENTRIES}
    assert stat.S_ISLNK(found["m/tied"].st_mode) and stat.S_ISDIR(found["m"].st_mode)
    return {(st.st_uid, st.st_gid) for st in found.values()}, {p: stat.S_IMODE(st.st_mode) for p, st in found.items()}


def test_uid_gid_umask_set_every_owner_and_mode(source: Path, mounter: Mounter) -> None:
    mnt = mounter(source, "-o", "uid=4242,gid=4343", "-o", "umask=022")
    owners, modes = _owners_and_modes(mnt)
    assert owners == {(4242, 4343)}
    assert modes == {"": 0o555, "m": 0o555, "m/w": 0o444, "m/w.json": 0o444, "epoch": 0o444,
                     ".ckptfs/index.json": 0o444, "m/tied": 0o777}
    listed = subprocess.run(["ls", "-ln", str(mnt / "m")], capture_output=True, text=True, check=True).stdout
    rows = {line.split()[8]: line.split()[:4] for line in listed.splitlines()[1:]}
    links = {name: ["lrwxrwxrwx", "1", "4242", "4343"] for name in ("tied", "tied.json", "tied.npy")}
    files = {name: ["-r--r--r--", "1", "4242", "4343"] for name in ("w", "w.json", "w.npy", "model.safetensors")}
    assert rows == {**links, **files}
    assert (mnt / "m" / "w").read_bytes() == W.numpy().tobytes()


def test_umask_takes_bits_away_and_the_kernel_enforces_them(source: Path, mounter: Mounter) -> None:
    source.chmod(0o644)
    mnt = mounter(source, "-o", f"uid=4242,gid={os.getgid()},umask=0027")
    owners, modes = _owners_and_modes(mnt)
    assert owners == {(4242, os.getgid())}
    assert modes == {"": 0o550, "m": 0o550, "m/w": 0o440, "m/w.json": 0o440, "epoch": 0o440,
                     ".ckptfs/index.json": 0o440, "m/tied": 0o777}
    assert (mnt / "m" / "w").read_bytes() == W.numpy().tobytes()  # by the group's bits (or as root)
    mnt = mounter(source, "-o", "uid=4242,gid=4343,umask=007")
    if os.geteuid() == 0:
        assert (mnt / "m" / "w").read_bytes() == W.numpy().tobytes()
    else:
        with pytest.raises(PermissionError):
            os.listdir(mnt)


def test_uid_gid_by_name_and_a_umask_that_lets_others_read(source: Path, mounter: Mounter) -> None:
    user = nobody()
    group = grp.getgrgid(user.pw_gid)
    source.chmod(0o600)
    mnt = mounter(source, "--uid", user.pw_name, "--gid", group.gr_name, "-o", "umask=022")
    st = os.stat(mnt / "m" / "w")
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (user.pw_uid, group.gr_gid, 0o444)
    assert stat.S_IMODE(os.stat(mnt / "m").st_mode) == 0o555
    assert (mnt / "m" / "w").read_bytes() == W.numpy().tobytes()


def test_without_options_owner_and_modes_follow_the_source(source: Path, mounter: Mounter) -> None:
    source.chmod(0o640)
    mnt = mounter(source)
    st = os.stat(mnt / "m" / "w")
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (os.getuid(), os.getgid(), 0o440)
    assert stat.S_IMODE(os.stat(mnt / "m").st_mode) == 0o550


def test_fsname_mount_flags_and_mount8_options(source: Path, mounter: Mounter) -> None:
    mnt = mounter(source, "-o", "fsname=my-model,noexec,noatime,ro,default_permissions",
                  "-o", "defaults,auto,noauto,nofail,_netdev,users,x-systemd.automount,comment=systemd.x,nosuid,nodev")
    entry = findmnt(mnt)
    assert (entry["source"], entry["fstype"]) == ("my-model", "fuse.ckptfs")
    vfs_options = entry["vfs-options"].split(",")
    assert {"ro", "noexec", "noatime", "nosuid", "nodev"} <= set(vfs_options), vfs_options
    assert (mnt / "epoch").read_text() == "3\n"


def test_default_fsname_is_the_absolute_source(source: Path, mounter: Mounter) -> None:
    mnt = mounter(source)
    entry = findmnt(mnt)
    assert (entry["source"], entry["fstype"]) == (str(source), "fuse.ckptfs")
    assert "ro" in entry["vfs-options"].split(",") and "noexec" not in entry["vfs-options"].split(",")


def test_auto_unmount_takes_the_mount_away_when_the_daemon_is_killed(source: Path, mounter: Mounter) -> None:
    mnt = mounter(source, "-o", "auto_unmount")
    (pid,) = daemon_pids(mnt)
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: str(mnt) not in mount_points())
    assert os.listdir(mnt) == []


def test_without_auto_unmount_a_killed_daemon_leaves_a_dead_mount(source: Path, mounter: Mounter) -> None:
    mnt = mounter(source)
    (pid,) = daemon_pids(mnt)
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not os.path.exists(f"/proc/{pid}"))
    assert mount_points().get(str(mnt)) == "fuse.ckptfs"
    assert run_cli("umount", mnt).returncode == 0


BAD_OPTIONS = {
    ("-o", "ro,frobnicate"): r"^ckptfs: -o frobnicate: unknown mount option \(ckptfs mount --help lists them\)$",
    ("-o", "max_read=4096"): r"^ckptfs: -o max_read=4096: unknown mount option",
    ("-o", "uid=no-such-user-here"): r"^ckptfs: -o uid=no-such-user-here: no such user$",
    ("-o", "gid=no-such-group-here"): r"^ckptfs: -o gid=no-such-group-here: no such group$",
    ("-o", "umask=088"): r"^ckptfs: -o umask=088: expected an octal mode from 000 to 777$",
    ("-o", "umask=1777"): r"^ckptfs: -o umask=1777: expected an octal mode",
    ("-o", "fsname="): r"^ckptfs: -o fsname=: expected a value$",
    ("-o", "views=yaml"): r"^ckptfs: -o views=yaml: unknown view 'yaml' \(views: json, npy, q_scales, ",
    ("-o", "views=json,yaml"): r"^ckptfs: -o views=json,yaml: unknown view 'yaml' \(views: json, npy, ",
    ("-o", "views=json,yaml,nest"): r"^ckptfs: -o views=json,yaml: unknown view 'yaml' \(views: json, npy, ",
    ("--debug", "-o", "views=zzz"): r"^ckptfs: -o views=zzz: unknown view 'zzz'",
    ("--uid", "no-such-user-here"): r"^ckptfs: --uid no-such-user-here: no such user$",
    ("--gid", "no-such-group-here"): r"^ckptfs: --gid no-such-group-here: no such group$",
}


@pytest.mark.parametrize("args", BAD_OPTIONS, ids=" ".join)
def test_a_refused_option_is_one_line_and_mounts_nothing(tmp_path: Path, source: Path, args: tuple[str, str]) -> None:
    (tmp_path / "mnt").mkdir()
    assert_one_line_error(run_cli("mount", *args, source, tmp_path / "mnt"), BAD_OPTIONS[args])
    assert not mounted_under(tmp_path)


LISTED = ["model.safetensors", "w", "w.json", "w.npy"]
"""``ls`` of directory ``m`` holding tensor ``w``."""


def _lists_as_nobody(mnt: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(as_user(nobody(), "ls", mnt / "m"), capture_output=True, text=True)


@root_only
def test_allow_other_lets_another_user_in(shared_dir: Path) -> None:
    source = save_zip({"m": {"w": W}}, shared_dir / "model.pt")
    source.chmod(0o644)
    mounter = Mounter(shared_dir / "mnt")
    try:
        private = mounter(source)
        assert "Permission denied" in _lists_as_nobody(private).stderr
        for args in (("-o", "allow_other"), ("--allow-other",)):
            mnt = mounter(source, *args)
            listed = _lists_as_nobody(mnt)
            assert (listed.returncode, listed.stdout.split()) == (0, LISTED), listed.stderr
            assert "allow_other" in findmnt(mnt)["fs-options"].split(",")
        for args in (("-o", "allow_root"), ("-o", "allow_root,allow_other")):
            mnt = mounter(source, *args)
            expected = LISTED if "allow_other" in args[1] else []
            assert _lists_as_nobody(mnt).stdout.split() == expected
            assert sorted(os.listdir(mnt / "m")) == LISTED
    finally:
        mounter.cleanup()


AS_NOBODY_WITH_FUSE = """
set -e
dir=$1
shift
mknod -m 666 "$dir/fuse" c 10 229
mount --bind "$dir/fuse" /dev/fuse
set +e
"$@"
status=$?
fusermount3 -u "$dir/mnt" 2>/dev/null
exit $status
"""


def _user_allow_other() -> bool:
    try:
        lines = Path("/etc/fuse.conf").read_text().splitlines()
    except FileNotFoundError:
        return False
    return any(line.split("#")[0].strip() == "user_allow_other" for line in lines)


def test_allow_other_for_a_plain_user_follows_etc_fuse_conf(shared_dir: Path) -> None:
    source = save_zip({"w": W}, shared_dir / "model.pt")
    (shared_dir / "mnt").mkdir(mode=0o777)
    (shared_dir / "mnt").chmod(0o777)  # fusermount3 wants the user to own or be able to write it
    mount = [*CLI, "mount", "-o", "allow_other", source, shared_dir / "mnt"]
    if IS_ROOT:  # as nobody, in a mount namespace whose /dev/fuse any user may open (as on a stock Debian)
        argv = [*private_mount_namespace(), "sh", "-c", AS_NOBODY_WITH_FUSE, "sh", shared_dir,
                *cli_as_user(nobody(), *mount[len(CLI):])]
        result = subprocess.run(list(map(str, argv)), capture_output=True, text=True, timeout=60)
    else:
        result = run_cli(*mount[len(CLI):])
    if _user_allow_other():
        assert (result.returncode, result.stderr) == (0, "")
    else:
        assert_one_line_error(result, r"^ckptfs: fusermount3: option allow_other only allowed if 'user_allow_other' "
                                      r"is set in /etc/fuse.conf")
        assert not mounted_under(shared_dir)
