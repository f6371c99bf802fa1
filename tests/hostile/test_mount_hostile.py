"""``ckptfs mount`` on every hostile case: a bounded tree that ``find`` walks quickly, or one line and nothing mounted."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Callable

import pytest

from ckptfs.limits import Limits
from hostile.cases import CASES, FLOATS, Case, deep_then_wide, deep_then_wide_tensors
from hostile.checks import assert_bounded, assert_cli_error
from hostile.conftest import HANG_SECONDS, MEMORY_BOUND, Runner
from hostile.mounting import Mounts, daemon_serving, holders, mount_points, peak_rss, wait_gone

MOUNT_ENTRIES = 120_000
"""Entries ``find`` may list in a mount of a hostile case: the nodes the mount makes (60,004 at most measured,
wide_list_20k's); with the index's bytes, what a mount's work grows with, counted as no clock counts it."""


def assert_mount_work(found: str, index: bytes) -> None:
    """The nodes a mount made and the index text it generated, within bounds that do not drift with the machine's
    load (the index's is the limit it is made under: past it, reading it fails)."""
    assert len(found.splitlines()) <= MOUNT_ENTRIES, f"{len(found.splitlines()):,} entries"
    assert len(index) <= Limits().max_generated_bytes


# deep_then_wide puts 100,000 entries in one directory: mounting it, walking it with find and reading its index
# take ~1.5 s of CPU whatever their depth (and 12 s of wall time on a busy 2-core machine): the suite would be
# long; test_mount_deep_then_wide mounts it at 10,000.
@pytest.mark.parametrize("case", [c for c in CASES if c.name != "deep_then_wide"], ids=lambda c: c.name)
def test_mount(case: Case, hostile_files: dict[str, Path], runner: Runner, mounts: Mounts) -> None:
    path = hostile_files[case.name]
    mnt = mounts.directory()
    start = time.monotonic()
    result = runner.run("mount", path, mnt)
    assert_bounded(result)
    if case.error is not None:
        assert_cli_error(result, path, case.reason)
        assert str(mnt) not in mount_points() and not any(mnt.iterdir())
        assert not holders(path)
        return
    assert result.rc == 0 and result.stderr == "", result.stderr
    daemon = daemon_serving(path)
    mounts.daemons.add(daemon)
    found = subprocess.run(["find", mnt], capture_output=True, text=True, timeout=30)
    assert found.returncode == 0 and found.stderr == "", found.stderr
    index = (mnt / ".ckptfs" / "index.json").read_bytes()
    assert index.startswith(b'{"ckptfs_index": 3')
    assert peak_rss(daemon) < MEMORY_BOUND
    assert_mount_work(found.stdout, index)
    unmounted = runner.run("umount", mnt)
    assert unmounted.rc == 0 and unmounted.stderr == "", unmounted.stderr
    wait_gone(daemon)
    assert time.monotonic() - start < HANG_SECONDS
    assert str(mnt) not in mount_points()


@pytest.mark.parametrize("make", [deep_then_wide, deep_then_wide_tensors], ids=["values", "tensors"])
def test_mount_deep_then_wide(make: Callable[[int], bytes], runner: Runner, mounts: Mounts, tmp_path: Path) -> None:
    """10,000 values or tensors at depth 990: find, and index.json, within the bounds.

    Entries give their parent's id, so 10,000 values make a small index; each
    tensor spells out its 990-key path and file as the index promises.
    """
    path = tmp_path / "deep_then_wide.pt"
    path.write_bytes(make(10_000))
    mnt = mounts.directory()
    start = time.monotonic()
    mounted = runner.run("mount", path, mnt)
    assert mounted.rc == 0
    mounts.daemons.add(daemon := daemon_serving(path))
    found = subprocess.run(["find", mnt], capture_output=True, check=True, timeout=60, text=True)
    index_bytes = (mnt / ".ckptfs" / "index.json").read_bytes()
    assert_mount_work(found.stdout, index_bytes)
    assert time.monotonic() - start < HANG_SECONDS
    assert peak_rss(daemon) < MEMORY_BOUND
    index = json.loads(index_bytes)
    if make is deep_then_wide_tensors:
        assert [len(listed["path"]) for listed in index["tensors"]] == [991] * 10_000
    else:
        assert [(listed["parent"], listed["value"]) for listed in index["entries"][991:]] == [(990, 1)] * 10_000


def test_mount_tensor_past_the_largest_file(hostile_files: dict[str, Path], runner: Runner, mounts: Mounts) -> None:
    """A stride-0 tensor of 2**64 bytes lists and stats at 2**63 - 1 bytes (the kernel's largest file) and reads
    up to there (a size taken modulo 2**64 would show an empty file); the kernel refuses reads past it."""
    path = hostile_files["huge_logical_stride0"]
    mnt = mounts.directory()
    assert runner.run("mount", path, mnt).rc == 0
    mounts.daemons.add(daemon_serving(path))
    listed = subprocess.run(["ls", "-l", mnt], capture_output=True, text=True, check=True).stdout
    assert f" {2**63 - 1} " in listed and "%root\n" in listed
    assert (mnt / "%root").stat().st_size == 2**63 - 1
    tail = subprocess.run(["dd", f"if={mnt / '%root'}", "bs=1", f"skip={2**63 - 16}", "count=15", "status=none"],
                          capture_output=True, check=True).stdout
    assert tail == FLOATS[:4] * 3 + FLOATS[:3]
