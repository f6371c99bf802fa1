"""Issue 24's other zip sizes of the scale section (``--sections scale``), beside its 200,000-tensor case:

* ``scale_small_mount``, ``scale_small_remount``, ``scale_small_rss``  20,000 tensors: ``ckptfs mount`` until
  it returns (not listed), the same from the metadata cache an ``ls`` wrote, and the daemon's peak RSS after
  ``find -ls``; targets 0.3 s / 0.15 s / 60 MiB
* ``scale_million_mount``, ``scale_million_rss``  1,000,000 tensors (full runs only: ``--quick`` skips it):
  mount ready (returned and the root of ~3,000,000 entries listed) and the daemon's peak RSS after that listing;
  target 700 MiB, with the default limits.

Checkpoints are ``scale.make_checkpoint``'s (the same MoE names, made with torch once into the work directory).
"""

from __future__ import annotations

import os
import subprocess
from typing import Any

import scale
from common import log, wait_for_cache_writers, warm
from results import Check

SMALL = 20_000
MILLION = 1_000_000
SMALL_TARGETS = {"scale_small_mount": 0.3, "scale_small_remount": 0.15, "scale_small_rss": 60.0}
MILLION_RSS = 700.0


def define_checks(bench: Any) -> None:
    checks = bench.res.checks
    for key, label in (("scale_small_mount", "ckptfs mount returns"), ("scale_small_remount", "repeat mount returns"),
                       ("scale_small_rss", "daemon peak RSS after find -ls, MiB")):
        checks.append(Check(key, "ckptfs", None, "<=", SMALL_TARGETS[key], f"{label} ({SMALL} tensors)"))
    if not bench.args.quick:
        checks.append(Check("scale_million_mount", "ckptfs", None, "<=", None,
                            f"mount ready ({MILLION} tensors), seconds"))
        checks.append(Check("scale_million_rss", "ckptfs", None, "<=", MILLION_RSS,
                            f"daemon peak RSS after the root's listing ({MILLION} tensors), MiB"))


def run(bench: Any) -> None:
    if not bench.have_ckptfs:
        return
    _small(bench)
    if not bench.args.quick:
        _million(bench)


def _small(bench: Any) -> None:
    src = scale.make_checkpoint(bench, SMALL)
    warm(src, 0, os.path.getsize(src))
    res = bench.res
    returned = res.fig("scale_small_mount", f"ckptfs mount returns, {SMALL} tensors", "s")
    again = res.fig("scale_small_remount", f"repeat ckptfs mount returns, {SMALL} tensors", "s")
    rss = res.fig("scale_small_rss", f"daemon peak RSS after find -ls, {SMALL} tensors", "MiB")
    cache_dir = bench.workdir / "scale-small-cache"
    cache = ("--cache-dir", str(cache_dir))
    for run_i in range(bench.args.runs):
        log(f"{SMALL}-tensor scale case, run {run_i + 1}/{bench.args.runs}")
        m = bench.mount_ckptfs(src, "ckptfs-scale-small")
        try:
            returned.add("ckptfs", m.returned_s)
            subprocess.run(["find", m.mnt, "-ls"], stdout=subprocess.DEVNULL, check=True)
            scale.add_rss(rss, "ckptfs", m.pid)
        finally:
            bench.mounts.stop(m)
        scale.cli_seconds(bench, "ls", src, cache)  # writes the metadata cache entry the repeat mount reads
        wait_for_cache_writers(cache_dir)  # from a process of its own, once ls is done
        m = bench.mount_ckptfs(src, "ckptfs-scale-small-again", extra=cache)
        try:
            again.add("ckptfs", m.returned_s)
        finally:
            bench.mounts.stop(m)


def _million(bench: Any) -> None:
    src = scale.make_checkpoint(bench, MILLION)
    warm(src, 0, os.path.getsize(src))
    ready = bench.res.fig("scale_million_mount", f"mount ready, {MILLION} tensors", "s")
    rss = bench.res.fig("scale_million_rss", f"daemon peak RSS after the root's listing, {MILLION} tensors", "MiB")
    for run_i in range(bench.args.runs):
        log(f"{MILLION}-tensor scale case, run {run_i + 1}/{bench.args.runs}")
        m = bench.mount_ckptfs(src, "ckptfs-scale-million")
        try:
            ready.add("ckptfs", m.ready_s)
            scale.add_rss(rss, "ckptfs", m.pid)
        finally:
            bench.mounts.stop(m)
