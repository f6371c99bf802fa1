"""Smoke run of scripts/bench (--quick --runs 1 --views): every side mounts, measures, cleans up and writes JSON.

Takes about 40-60 s; it checks that the benchmark works, not how fast anything is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.mount,
    pytest.mark.slow,
]


def fuse_mounts_under(path: Path) -> list[str]:
    prefix = str(path) + "/"
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(prefix)]


def test_bench_quick(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [str(REPO / "scripts" / "bench"), "--quick", "--runs", "1", "--views", "--workdir", str(workdir),
         "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, "CKPTFS_VENV": os.path.dirname(os.path.dirname(sys.executable))},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Ratios" in proc.stdout
    result = json.loads(out.read_text())
    figures = result["figures"]
    for key in ("seq_first_dd_1M", "reread_cat", "memmap_first", "memmap_second", "rand4k"):
        assert set(figures[key]["sides"]) >= {"raw", "cpass", "ckptfs"}, key
    for key in ("mount_zip", "mount_legacy"):
        assert set(figures[key]["sides"]) >= {"ckptfs", "torch", "clist", "cpickle", "floor"}, key
    for key in ("find_zip", "find_legacy", "rss_zip", "rss_legacy"):
        assert set(figures[key]["sides"]) >= {"ckptfs", "clist"}, key
    # The C listing showed the root ckptfs showed: one file per tensor, its sidecar and .npy, /.ckptfs and
    # model.safetensors.
    assert result["meta"]["clist_root_entries"] == {"zip": 3 * 2000 + 2, "legacy": 3 * 2000 + 2}
    # Dropping a mounted file's page cache empties it, and the check can see that for every mounted side: their
    # files belong to the user running the benchmark (the kernel hides the page cache of others' files).
    assert result["meta"]["resident_after_drop_max"] == {"cpass": 0.0, "ckptfs": 0.0}
    # Both sides read ahead alike: 1 MiB where root may write sysfs (each raises its own), else the kernel's default.
    read_ahead = {side: result["meta"]["sides"][side]["read_ahead_kb"] for side in ("cpass", "ckptfs")}
    assert read_ahead["cpass"] == read_ahead["ckptfs"]
    if os.geteuid() == 0 and os.access("/sys/class/bdi", os.W_OK):
        assert read_ahead["cpass"] == 1024
    assert result["checks"] and all("median" in c for c in result["checks"])
    # The views section (--views): each view beside its limit, the same tensors and bytes on both sides.
    three, two = {"raw", "tensorfile", "ckptfs"}, {"raw", "ckptfs"}
    views = {"views_cp_cold": three, "views_npy_first": three, "views_safe_open_mid_warm": two,
             "views_diff_cold": two, "views_convert": two, "views_zarr": three}
    for key, sides in views.items():
        assert set(figures[key]["sides"]) == sides, key
    assert result["meta"]["views"]["safe_open_tensors"] == {"big": 1, "mid": 100}
    assert result["meta"]["views"]["zarr_arrays"] == result["meta"]["views"]["mid_tensors"] == 100
    assert result["meta"]["views"]["resident_after_drop_max"] == 0.0
    # Everything it mounted is gone, and so are its checkpoints (the work directory was ours to fill).
    assert fuse_mounts_under(tmp_path) == []
    assert not (workdir / "big.pt").exists()
    assert not (workdir / "views").exists()
