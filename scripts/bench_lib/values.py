"""The values section of scripts/bench (``--sections values``): checkpoints of plain values only, no tensor, each
value shown as a small file, and every file read once: ``find MNT -type f -exec cat {} + > /dev/null``.

Two checkpoints (``torch_worker.make_values``, 62,062 values; --quick 6,206):

* ``flat``   issue 24's case: one list of floats beside two scalars, 62,062 value files in one directory from a
             559 KB pickle
* ``nested`` an optimizer-like state: per parameter a dict of floats, an int, a bool, a str, None and a shape
             list; ~62,000 value files in ~11,000 directories from a 586 KB pickle

Figures, per run and checkpoint, on a fresh mount (``ckptfs mount`` returned; nothing listed or read yet):

* ``values_cat_KIND``      the find's wall seconds; plain: the same files copied into a directory of the work
                           directory's file system, warm (find and cat alone: the floor)
* ``values_ls_KIND``       ``find MNT -ls > /dev/null`` on another fresh mount: listing alone, nothing read (value
                           files are stored into the page cache only once one is read: this one must not pay it)
* ``values_cat_cpu_KIND``  the daemon's CPU time during it, per file read (µs)
* ``values_rss_KIND``      the daemon's peak RSS after it

Bench calls ``run(bench)`` with itself.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any

from common import log, made_as, made_before, proc_stat, proc_status_kib, timed, warm
from results import Check
from torch_client import TorchWorker

COUNT = 62_062
QUICK_COUNT = 6_206
KINDS = ("flat", "nested")
TARGET_S = 3.0
"""Issue 24: every file of the flat case read once in at most this many seconds."""
SIDE_NOTES = {"plain": "plain = the same files in a directory of the work directory's file system"}


def values(args: Any) -> int:
    return QUICK_COUNT if args.quick else COUNT


def define_checks(bench: Any) -> None:
    bench.res.side_notes.update(SIDE_NOTES)
    n = values(bench.args)
    checks = bench.res.checks
    for kind in KINDS:
        target = TARGET_S if kind == "flat" and n >= COUNT else None
        checks.append(Check(f"values_cat_{kind}", "ckptfs", None, "<=", target,
                            f"find -type f -exec cat, {n} values ({kind}), seconds"))
        checks.append(Check(f"values_cat_{kind}", "ckptfs", "plain", "<=", None,
                            f"find -type f -exec cat ({kind}) / the same files in a plain directory"))
        checks.append(Check(f"values_ls_{kind}", "ckptfs", None, "<=", None,
                            f"find -ls, {n} values ({kind}), nothing read, seconds"))
        checks.append(Check(f"values_ls_{kind}", "ckptfs", "plain", "<=", None,
                            f"find -ls ({kind}) / the same files in a plain directory"))
        checks.append(Check(f"values_cat_cpu_{kind}", "ckptfs", None, "<=", None,
                            f"daemon CPU per file read ({kind}), us"))
        checks.append(Check(f"values_rss_{kind}", "ckptfs", None, "<=", None,
                            f"daemon peak RSS after reading every file ({kind}), MiB"))


def make_checkpoint(bench: Any, kind: str) -> str:
    n = values(bench.args)
    path = bench.workdir / f"values-{kind}-{n}.pt"
    manifest = bench.workdir / f"values-{kind}-{n}.json"
    want = {"values": n, "kind": kind, "version": 1}
    if not made_before(manifest, want, path):
        bench.torch = bench.torch or TorchWorker()
        log(f"creating a checkpoint of about {n} plain values ({kind}) with torch")
        bench.torch.call(op="make_values", path=str(path), count=n, kind=kind)
        made_as(manifest, want)
    bench.res.meta["checkpoints"] = {**bench.res.meta.get("checkpoints", {}),
                                     f"values_{kind}": {"path": str(path), "size": os.path.getsize(path)}}
    return str(path)


def _cat_all(root: str) -> float:
    """Seconds of ``find ROOT -type f -exec cat {} +``, output discarded; a file that fails to read fails it."""
    return timed(["find", root, "-type", "f", "-exec", "cat", "{}", "+"])


def _list_all(root: str) -> float:
    return timed(["find", root, "-ls"])


def _files(root: str) -> int:
    return subprocess.run(["find", root, "-type", "f"], capture_output=True, check=True).stdout.count(b"\n")


def run(bench: Any) -> None:
    n = values(bench.args)
    res = bench.res
    for kind in KINDS:
        src = make_checkpoint(bench, kind)
        warm(src, 0, os.path.getsize(src))
        cat = res.fig(f"values_cat_{kind}", f"find -type f -exec cat, {n} values ({kind})", "s")
        cpu = res.fig(f"values_cat_cpu_{kind}", f"daemon CPU per file read, {n} values ({kind})", "us")
        rss = res.fig(f"values_rss_{kind}", f"daemon peak RSS after reading every file ({kind})", "MiB")
        listed = res.fig(f"values_ls_{kind}", f"find -ls, {n} values ({kind}), nothing read", "s")
        tree = bench.workdir / f"values-tree-{kind}"
        for run_i in range(bench.args.runs):
            log(f"{n} values ({kind}), run {run_i + 1}/{bench.args.runs}")
            if bench.have_ckptfs:
                m = bench.mount_ckptfs(src, f"ckptfs-values-{kind}")
                try:
                    before = proc_stat(m.pid)
                    cat.add("ckptfs", _cat_all(m.mnt))
                    after = proc_stat(m.pid)
                    files = res.meta.setdefault("values_files", {}).get(kind) or _files(m.mnt)
                    res.meta["values_files"][kind] = files
                    if before is not None and after is not None:
                        cpu.add("ckptfs", (after.cpu_s - before.cpu_s) / files * 1e6)
                    hwm = proc_status_kib(m.pid, "VmHWM")
                    if hwm is not None:
                        rss.add("ckptfs", hwm / 1024)
                    if not tree.exists():
                        shutil.copytree(m.mnt, tree, symlinks=True)
                finally:
                    bench.mounts.stop(m)
                m = bench.mount_ckptfs(src, f"ckptfs-values-{kind}")
                try:
                    listed.add("ckptfs", _list_all(m.mnt))
                finally:
                    bench.mounts.stop(m)
            if tree.exists():
                _cat_all(str(tree))  # warm: its pages and inodes in the kernel's caches, as the source is
                cat.add("plain", _cat_all(str(tree)))
                listed.add("plain", _list_all(str(tree)))
