"""``ckptfs mounts``: every ckptfs mount, one per line, the same ones findmnt lists."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
import torch
from corpus import save_zip

from mount.helpers import Mounter, daemon_pids, run_cli, wait_until

pytestmark = pytest.mark.mount


def findmnt_ckptfs() -> list[tuple[str, str]]:
    result = subprocess.run(["findmnt", "--json", "-t", "fuse.ckptfs", "-o", "TARGET,SOURCE"], capture_output=True,
                            text=True)
    if result.returncode == 1 and not result.stdout:  # findmnt: nothing found
        return []
    return [(entry["target"], entry["source"]) for entry in json.loads(result.stdout)["filesystems"]]


def test_mounts_lists_what_findmnt_lists(tmp_path: Path, mounter: Mounter) -> None:
    plain = save_zip({"w": torch.ones(2)}, tmp_path / "model.pt")
    spaced = save_zip({"w": torch.ones(2)}, tmp_path / "my model\\v2.pt")
    odd = mounter.base / "with space\tand tab"
    odd.mkdir(parents=True)
    mounter.made.append(odd)
    assert run_cli("mount", spaced, odd).returncode == 0
    first, named = mounter(plain), mounter(plain, "-o", "fsname=named")
    ours = {(str(first), str(plain)), (str(odd), str(spaced)), (str(named), "named")}
    base = f"{mounter.base}/"

    as_json = run_cli("mounts", "--json")
    assert as_json.returncode == 0 and base not in as_json.stderr  # other processes' dead mounts are named there
    listed = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert all(set(entry) == {"mountpoint", "source", "uid", "alive", "answering"} for entry in listed)
    assert ours <= {(entry["mountpoint"], entry["source"]) for entry in listed}
    assert {entry["uid"] for entry in listed if (entry["mountpoint"], entry["source"]) in ours} == {os.getuid()}
    # Other processes may mount and unmount meanwhile: compare below our directory only.
    mine = {(entry["mountpoint"], entry["source"]) for entry in listed if entry["mountpoint"].startswith(base)}
    assert mine == {(target, source) for target, source in findmnt_ckptfs() if target.startswith(base)} == ours

    as_text = run_cli("mounts")
    assert as_text.returncode == 0 and base not in as_text.stderr
    lines = as_text.stdout.splitlines()
    assert f"{first} {plain}" in lines and f"{named} named" in lines
    escaped_dir = str(odd).replace(" ", "\\040").replace("\t", "\\011")
    assert f"{escaped_dir} {tmp_path}/my\\040model\\134v2.pt" in lines
    assert len([line for line in lines if line.startswith(base)]) == 3


def test_mounts_drops_what_is_unmounted(tmp_path: Path, mounter: Mounter) -> None:
    source = save_zip({"w": torch.ones(2)}, tmp_path / "model.pt")
    mnt = mounter(source)
    assert f"{mnt} {source}" in run_cli("mounts").stdout.splitlines()
    assert run_cli("umount", mnt).returncode == 0
    assert str(mnt) not in run_cli("mounts").stdout


def test_a_mount_whose_daemon_was_killed_is_listed_as_dead(tmp_path: Path, mounter: Mounter) -> None:
    source = save_zip({"w": torch.ones(2)}, tmp_path / "model.pt")
    alive, killed = mounter(source), mounter(source)
    (pid,) = daemon_pids(killed)
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not daemon_pids(killed))
    as_text = run_cli("mounts")
    assert as_text.returncode == 0
    assert f"{alive} {source}" in as_text.stdout.splitlines()
    assert f"{killed} {source} dead" in as_text.stdout.splitlines()
    assert [line for line in as_text.stderr.splitlines() if str(mounter.base) in line] == [
        f"ckptfs: {killed}: dead (its daemon is gone); unmount it with: ckptfs umount {killed}"]
    listed = {entry["mountpoint"]: entry for entry in map(json.loads, run_cli("mounts", "--json").stdout.splitlines())}
    assert (listed[str(alive)]["alive"], listed[str(killed)]["alive"]) == (True, False)
    assert (listed[str(alive)]["answering"], listed[str(killed)]["answering"]) == (True, False)
    assert run_cli("umount", killed).returncode == 0
    assert str(killed) not in run_cli("mounts").stdout


def test_a_mount_whose_daemon_is_stopped_is_listed_as_unresponsive(tmp_path: Path, mounter: Mounter) -> None:
    """statfs of a stopped daemon's mount waits as long as the daemon lives: ``mounts`` waits 2 s, not forever."""
    source = save_zip({"w": torch.ones(2)}, tmp_path / "model.pt")
    alive, stopped = mounter(source), mounter(source)
    (pid,) = daemon_pids(stopped)
    os.kill(pid, signal.SIGSTOP)
    try:
        as_text = run_cli("mounts")
        as_json = run_cli("mounts", "--json")
    finally:
        os.kill(pid, signal.SIGCONT)
    assert as_text.returncode == 0
    assert f"{alive} {source}" in as_text.stdout.splitlines()
    assert f"{stopped} {source} unresponsive" in as_text.stdout.splitlines()
    assert [line for line in as_text.stderr.splitlines() if str(mounter.base) in line] == [
        f"ckptfs: {stopped}: unresponsive (its daemon did not answer within 2 s: stopped or stuck); unmount it with: "
        f"ckptfs umount {stopped}"]
    listed = {entry["mountpoint"]: entry for entry in map(json.loads, as_json.stdout.splitlines())}
    assert {key: listed[str(stopped)][key] for key in ("alive", "answering")} == {"alive": True, "answering": False}
    assert {key: listed[str(alive)][key] for key in ("alive", "answering")} == {"alive": True, "answering": True}
    assert (stopped / "w").read_bytes() == torch.ones(2).numpy().tobytes()  # answering again once continued
