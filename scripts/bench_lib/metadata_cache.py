"""Bench section ``cache``: mounts and ``ckptfs ls`` of the many-tensor zip read from the metadata cache.

Every other ckptfs figure parses (the bench points ``XDG_CACHE_HOME`` at a folder that cannot be made);
here the first mount writes the entry into the work directory's own cache, and each run then mounts and
lists from it, beside a parse of the same run (``ls`` with ``--no-cache``). With the compiled scanner, a zip of
fewer than ``ckptfs.cache.MIN_TENSORS_SCANNED`` tensors gets no entry (its parse is the quicker): then both parse.
"""

from __future__ import annotations

import subprocess
import time
from typing import Any

from common import wait_for_cache_writers

NO_CACHE_HOME = "/dev/null"
"""``XDG_CACHE_HOME`` of the bench's other ckptfs commands: no cache folder can be made below it, so every
open parses (as ``--no-cache`` does, in versions that do not know the option too)."""


def run_cached(bench: Any, log: Any) -> None:
    """Adds ``mount_zip_cached`` (mount ready from the cache), ``ls_zip`` and ``ls_zip_cached``."""
    cache = bench.workdir / "metadata-cache"
    src = bench.many
    ready = bench.res.fig("mount_zip_cached", f"mount ready from the metadata cache, {bench.n_many} tensors, zip", "s")
    ls = bench.res.fig("ls_zip", f"ckptfs ls --no-cache, {bench.n_many} tensors, zip", "s")
    ls_cached = bench.res.fig("ls_zip_cached", f"ckptfs ls from the metadata cache, {bench.n_many} tensors, zip", "s")
    argv, env = bench.ckptfs_argv(src, str(bench.workdir / "mnt" / "cached"))
    ls_argv = [*argv[: argv.index("mount")], "ls", src]
    first = bench.mounts.start("ckptfs-cache-write", [*argv, "--cache-dir", str(cache)], argv[argv.index(src) + 1],
                               env=env, daemon=bench.args.mount_mode == "daemon")
    bench.mounts.stop(first)
    wait_for_cache_writers(cache)  # the entry is written by a process of its own once mounted
    entry_bytes = sum(p.stat().st_size for p in (cache / "metadata").glob("*.ckm"))
    bench.res.meta["metadata_cache_entry_bytes"] = entry_bytes
    log(f"metadata cache entry: {entry_bytes} bytes ({entry_bytes / max(bench.n_many, 1):.0f} per tensor)"
        if entry_bytes else "no metadata cache entry was made (a zip the compiled scanner reads is cached from "
                            "ckptfs.cache.MIN_TENSORS_SCANNED tensors on): the cached rows below are parses")
    for run_i in range(bench.args.runs):
        log(f"metadata cache, run {run_i + 1}/{bench.args.runs}")
        m = bench.mounts.start(f"ckptfs-cached-{run_i}", [*argv, "--cache-dir", str(cache)],
                               argv[argv.index(src) + 1], env=env, daemon=bench.args.mount_mode == "daemon")
        try:
            ready.add("ckptfs", m.ready_s)
        finally:
            bench.mounts.stop(m)
        ls.add("ckptfs", _timed([*ls_argv, "--no-cache"], env))
        ls_cached.add("ckptfs", _timed([*ls_argv, "--cache-dir", str(cache)], env))


def _timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start

