"""Mounting and listing many small tensors (20,000; --quick 2,000), zip and legacy, beside torch.load, a C
listing of the same root and the floor of a Python mount; and the fixed cost of a mount (one tensor)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import TYPE_CHECKING

from common import LIB, log, proc_status_kib, timed, warm, write_root_entries
from results import Check
from torch_client import TorchWorker

if TYPE_CHECKING:
    from harness import Bench


def run(b: Bench) -> None:
    """Mounts of the one-tensor and the many-tensor checkpoints (zip and legacy), listed with find -ls, beside torch."""
    a = b.args
    assert b.mounts is not None
    for p in (b.many, b.legacy):
        warm(p, 0, os.path.getsize(p))
    if b.torch is None:
        b.torch = TorchWorker()
    b.res.meta["torch_import_s"] = b.torch.hello["import_s"]
    entries: dict[str, int] = {}
    root_entries: dict[str, int] = {}
    for run_i in range(a.runs):
        log(f"{b.n_many}-tensor mounts, run {run_i + 1}/{a.runs}")
        # The fixed cost of a mount (start-up, imports, fork, FUSE init): the one-tensor checkpoint.
        one = b.res.fig("mount_one", "mount ready, 1 tensor (fixed cost)", "s")
        for side in (["ckptfs"] if b.have_ckptfs else []) + (["alt"] if b.have_alt else []):
            m = b.mount_ckptfs(b.big, f"{side}-one", alt=side == "alt")
            try:
                one.add(side, m.ready_s)
            finally:
                b.mounts.stop(m)
        for fmt, src in (("zip", b.many), ("legacy", b.legacy)):
            ready = b.res.fig(f"mount_{fmt}", f"mount ready, {b.n_many} tensors, {fmt}", "s")
            find = b.res.fig(f"find_{fmt}", f"find -ls, {b.n_many} tensors, {fmt}", "s")
            rss = b.res.fig(f"rss_{fmt}", f"daemon peak RSS, {b.n_many} tensors, {fmt}", "MiB")
            listing = b.workdir / f"root-entries-{fmt}.txt"
            # The floor of a Python mount: a Python process reading the pickle with the C unpickler, and
            # the C file system listing the same root.
            ready.add("cpickle", timed([sys.executable, str(LIB / "pickle_floor.py"), src]))
            sides = ((["ckptfs"] if b.have_ckptfs else []) + (["alt"] if b.have_alt else [])
                     + (["ratar"] if a.ratarmount and fmt == "zip" else [])
                     + (["clist"] if b.have_ckptfs else []))
            for side in sides:
                tag = f"{side}-{fmt}"
                if side == "ratar":
                    m = b.mount_ratar(src, tag)
                elif side == "clist":
                    m = b.mount_clist(listing, tag)
                else:
                    m = b.mount_ckptfs(src, tag, alt=side == "alt")
                try:
                    ready.add(side, m.ready_s)
                    if side == "clist":
                        ready.add("floor", ready.values["cpickle"][-1] + m.ready_s)
                    find.add(side, timed(["find", m.mnt, "-ls"]))
                    if run_i == 0:
                        out = subprocess.run(["find", m.mnt, "-type", "f"], capture_output=True, check=True)
                        entries[tag] = out.stdout.count(b"\n")
                        if side == "ckptfs":
                            root_entries[fmt] = write_root_entries(m.mnt, listing)
                    hwm = proc_status_kib(m.pid, "VmHWM")
                    if hwm is not None:
                        rss.add(side, hwm / 1024)
                finally:
                    b.mounts.stop(m)
            ready.add("torch", b.torch.call(op="load", path=src, mmap=(fmt == "zip"))["seconds"])
    b.res.meta["files_listed"] = entries
    b.res.meta["clist_root_entries"] = root_entries
    for tag, n in entries.items():
        if tag.startswith("ckptfs") and n < b.n_many:
            log(f"warning: {tag} lists {n} files for {b.n_many} tensors")


def define_checks(b: Bench) -> None:
    c = b.res.checks
    for fmt in ("zip", "legacy"):
        if fmt == "zip":
            c.append(Check("mount_one", "ckptfs", None, "<=", None, "mount ready (1 tensor), seconds"))
        c.append(Check(f"mount_{fmt}", "ckptfs", None, "<=", 0.4, f"mount ready ({fmt}), seconds"))
        c.append(Check(f"mount_{fmt}", "ckptfs", "torch", "<=", 0.15, f"mount ready ({fmt}) / torch.load+listing"))
        c.append(Check(f"mount_{fmt}", "ckptfs", "ratar", "<=", None, f"mount ready ({fmt}) / ratarmount"))
        c.append(Check(f"find_{fmt}", "ckptfs", None, "<=", 0.3, f"find -ls ({fmt}), seconds"))
        c.append(Check(f"find_{fmt}", "ckptfs", "ratar", "<=", None, f"find -ls ({fmt}) / ratarmount"))
        c.append(Check(f"mount_{fmt}", "ckptfs", "clist", "<=", None,
                       f"mount ready ({fmt}) / C listing of the same root"))
        c.append(Check(f"mount_{fmt}", "floor", None, "<=", None,
                       f"floor of a Python mount ({fmt}): C unpickler process + C listing, seconds"))
        c.append(Check(f"mount_{fmt}", "ckptfs", "floor", "<=", None, f"mount ready ({fmt}) / that floor"))
        c.append(Check(f"find_{fmt}", "ckptfs", "clist", "<=", None, f"find -ls ({fmt}) / C listing of the same root"))
        c.append(Check(f"rss_{fmt}", "ckptfs", None, "<=", 80, f"daemon peak RSS ({fmt}), MiB"))
    if b.have_alt:
        for key in [f"{k}_{fmt}" for fmt in ("zip", "legacy") for k in ("mount", "find", "rss")] + ["mount_one"]:
            c.append(Check(key, "alt", "ckptfs", ">=", None, f"A/B {key}: alt / ckptfs"))
