"""The big tensor (1 GiB; --quick 64 MiB) read on every side: sections seq (dd, cat), memmap (numpy) and rand
(4 KiB preads), and the daemon's peak RSS; one set of mounts serves the three."""

from __future__ import annotations

import gc
import json
import os
import statistics
import time
from typing import TYPE_CHECKING, Any

import numpy as np
from common import run as run_command
from common import (GiB, MiB, BenchError, drop_cache, find_file_of_size, log, loadavg, proc_stat, proc_status_kib,
                    read_ahead_kb, resident, same_bytes, timed, warm)
from results import Check

if TYPE_CHECKING:
    from harness import Bench
    from mounts import Mount

NAMES = ("seq", "memmap", "rand")
SEQ_TOOLS = ("dd_1M", "dd_128k", "cat")


def run(b: Bench) -> None:
    """Mounts the big tensor on every side, then runs the selected sections of seq, memmap and rand on them."""
    a = b.args
    assert b.mounts is not None
    warm(b.big, b.big_off, b.big_len)
    sides: dict[str, dict[str, Any]] = {"raw": {"path": b.big, "base": b.big_off, "mount": None}}
    made: list[Mount] = []
    try:
        m = b.mount_cpass()
        made.append(m)
        sides["cpass"] = {"path": os.path.join(m.mnt, "tensor"), "base": 0, "mount": m}
        if b.have_ckptfs:
            m = b.mount_ckptfs(b.big, "ckptfs-big")
            made.append(m)
            sides["ckptfs"] = {"path": find_file_of_size(m.mnt, b.big_len), "base": 0, "mount": m}
            b.res.meta["ckptfs_big_mount_s"] = m.ready_s
        if b.have_alt:
            m = b.mount_ckptfs(b.big, "alt-big", alt=True)
            made.append(m)
            sides["alt"] = {"path": find_file_of_size(m.mnt, b.big_len), "base": 0, "mount": m}
        if a.ratarmount:
            m = b.mount_ratar(b.big, "ratar-big")
            made.append(m)
            sides["ratar"] = {"path": find_file_of_size(m.mnt, b.big_len), "base": 0, "mount": m}
        for s in sides.values():
            if s["mount"] is not None:
                same_bytes(b.big, b.big_off, s["path"], 0, b.big_len)
                s["read_ahead_kb"] = read_ahead_kb(s["mount"].mnt)
        b.res.meta["sides"] = {
            n: {"path": s["path"], "read_ahead_kb": s.get("read_ahead_kb"),
                "daemon_pid": s["mount"].pid if s["mount"] else None,
                "daemon_threads": (proc_stat(s["mount"].pid).threads
                                   if s["mount"] and proc_stat(s["mount"].pid) else None)}
            for n, s in sides.items()}
        log("sides: " + ", ".join(f"{n}={s['path']} (read_ahead_kb={s.get('read_ahead_kb')})"
                                  for n, s in sides.items()))
        if "seq" in a.sections:
            section_seq(b, sides)
        if "memmap" in a.sections:
            section_memmap(b, sides)
        if "rand" in a.sections:
            section_rand(b, sides)
        for name, s in sides.items():
            if s["mount"] is not None:
                hwm = proc_status_kib(s["mount"].pid, "VmHWM")
                if hwm is not None:
                    b.res.fig("rss_big", f"daemon peak RSS, {b.big_len / MiB:.0f} MiB tensor mount",
                              "MiB").add(name, hwm / 1024)
    finally:
        for m in reversed(made):
            b.mounts.stop(m)
    b.res.meta["loadavg"]["after_big"] = loadavg()


def _drop(s: dict[str, Any]) -> None:
    if s["mount"] is not None:
        drop_cache(s["path"])


def section_seq(b: Bench, sides: dict[str, dict[str, Any]]) -> None:
    a = b.args
    gb = b.big_len / 1e9
    resid_after_drop: dict[str, float] = {}
    hidden: set[str] = set()
    daemon: dict[str, dict[str, list[float]]] = {}
    for run_i in range(a.runs):
        log(f"sequential reads, run {run_i + 1}/{a.runs}")
        for tool in SEQ_TOOLS:
            first = b.res.fig(f"seq_first_{tool}", f"first read, {tool.replace('_', ' ')}", "GB/s")
            again = b.res.fig(f"reread_{tool}", f"re-read (page cache), {tool.replace('_', ' ')}", "GB/s")
            for name, s in sides.items():
                _drop(s)
                if s["mount"] is not None:
                    r = resident(s["path"])
                    if r is None:
                        hidden.add(name)
                    else:
                        resid_after_drop[name] = max(resid_after_drop.get(name, 0.0), r)
                before = proc_stat(s["mount"].pid) if s["mount"] else None
                t = _seq_once(b, tool, s)
                after = proc_stat(s["mount"].pid) if s["mount"] else None
                first.add(name, gb / t)
                if before and after:
                    d = daemon.setdefault(name, {"minflt_per_GiB": [], "cpu_s_per_GiB": []})
                    d["minflt_per_GiB"].append((after.minflt - before.minflt) / (b.big_len / GiB))
                    d["cpu_s_per_GiB"].append((after.cpu_s - before.cpu_s) / (b.big_len / GiB))
                again.add(name, gb / _seq_once(b, tool, s))
    b.res.meta["resident_after_drop_max"] = resid_after_drop
    b.res.meta["source_resident"] = resident(b.big, b.big_off, b.big_len)
    b.res.meta["daemon_first_read"] = {
        n: {k: statistics.median(v) for k, v in d.items()} for n, d in daemon.items()}
    if any(v > 0.01 for v in resid_after_drop.values()):
        log(f"warning: page cache not fully dropped: {resid_after_drop}")
    if hidden:
        log(f"warning: the kernel hides the page cache of {sorted(hidden)} from this user (not their owner): "
            "whether the drop emptied it is unknown")


def _seq_once(b: Bench, tool: str, s: dict[str, Any]) -> float:
    path, base = s["path"], s["base"]
    raw = s["mount"] is None
    if tool.startswith("dd_"):
        bs = tool[3:]
        argv = ["dd", f"if={path}", "of=/dev/null", f"bs={bs}", "status=none"]
        if raw:
            argv += ["iflag=skip_bytes,count_bytes", f"skip={base}", f"count={b.big_len}"]
        return timed(argv)
    if raw:  # cat from a descriptor positioned at the range (reads the few KiB of zip trailer too)
        fd = os.open(path, os.O_RDONLY)
        try:
            os.lseek(fd, base, os.SEEK_SET)
            return timed(["cat"], stdin=fd)
        finally:
            os.close(fd)
    return timed(["cat", path])


def _memmap_sum(b: Bench, s: dict[str, Any]) -> tuple[float, float]:
    n = b.big_len // 4
    t0 = time.perf_counter()
    arr = np.memmap(s["path"], dtype="<f4", mode="r", offset=s["base"], shape=(n,))
    total = float(arr.sum())
    dt = time.perf_counter() - t0
    del arr
    gc.collect()
    return dt, total


def section_memmap(b: Bench, sides: dict[str, dict[str, Any]]) -> None:
    a = b.args
    gb = b.big_len / 1e9
    sums: dict[str, set[float]] = {}
    for run_i in range(a.runs):
        log(f"np.memmap sums, run {run_i + 1}/{a.runs}")
        f1 = b.res.fig("memmap_first", "np.memmap .sum(), first", "GB/s")
        f2 = b.res.fig("memmap_second", "np.memmap .sum(), second", "GB/s")
        for name, s in sides.items():
            _drop(s)
            t, total = _memmap_sum(b, s)
            f1.add(name, gb / t)
            sums.setdefault(name, set()).add(total)
            t, total = _memmap_sum(b, s)
            f2.add(name, gb / t)
            sums.setdefault(name, set()).add(total)
    distinct = {v for vals in sums.values() for v in vals}
    if len(distinct) != 1:
        raise BenchError(f"memmap sums differ between sides: {sums}")


def section_rand(b: Bench, sides: dict[str, dict[str, Any]]) -> None:
    a = b.args
    fig = b.res.fig("rand4k", "random 4 KiB pread, first read, mean latency", "us")
    detail: dict[str, list[dict[str, float]]] = {}
    for run_i in range(a.runs):
        log(f"random 4 KiB preads, run {run_i + 1}/{a.runs}")
        for name, s in sides.items():
            _drop(s)
            count = a.preads
            if name == "ratar":
                # ratarmount seeks in a zip member by reading from its start: a random read takes ~0.1-0.5 s
                # on 1 GiB. Probe, then read as many as fit in about 15 s.
                probe = _preads(b, s, 8, run_i + 101)
                count = max(8, min(a.preads, int(15e6 / max(probe["mean_us"], 1.0))))
                _drop(s)
            stats = _preads(b, s, count, run_i + 1)
            fig.add(name, stats["mean_us"])
            detail.setdefault(name, []).append(stats)
    fig.extra = {n: {k: statistics.median(d[k] for d in v) for k in ("count", "p50_us", "p90_us", "p99_us",
                                                                       "max_us")}
                 for n, v in detail.items()}


def _preads(b: Bench, s: dict[str, Any], count: int, seed: int) -> dict[str, float]:
    out = run_command([b.bin["preadbench"], s["path"], str(s["base"]), str(b.big_len), str(count), "4096",
               str(seed)], capture_output=True, text=True).stdout
    return json.loads(out)


def define_checks(b: Bench) -> None:
    c = b.res.checks
    for tool in SEQ_TOOLS:
        f = f"seq_first_{tool}"
        c.append(Check(f, "ckptfs", "cpass", ">=", 0.9, f"first read {tool}: ckptfs / C pass-through"))
        c.append(Check(f, "ckptfs", "ratar", ">=", 2.5, f"first read {tool}: ckptfs / ratarmount"))
        c.append(Check(f, "ckptfs", "raw", ">=", None, f"first read {tool}: ckptfs / raw"))
        c.append(Check(f, "cpass", "raw", ">=", None, f"first read {tool}: C pass-through / raw"))
    for tool in SEQ_TOOLS:
        f = f"reread_{tool}"
        c.append(Check(f, "ckptfs", "raw", ">=", 0.45, f"re-read {tool}: ckptfs / raw"))
        c.append(Check(f, "cpass", "raw", ">=", None, f"re-read {tool}: C pass-through / raw"))
    c.append(Check("memmap_first", "ckptfs", "raw", ">=", 0.35, "memmap sum first: ckptfs / raw"))
    c.append(Check("memmap_first", "cpass", "raw", ">=", None, "memmap sum first: C pass-through / raw"))
    c.append(Check("memmap_second", "ckptfs", "raw", ">=", 0.7, "memmap sum second: ckptfs / raw"))
    c.append(Check("memmap_second", "cpass", "raw", ">=", None, "memmap sum second: C pass-through / raw"))
    c.append(Check("rand4k", "ckptfs", "raw", "<=", 25, "random 4 KiB pread latency: ckptfs / raw"))
    c.append(Check("rand4k", "cpass", "raw", "<=", None, "random 4 KiB pread latency: C pass-through / raw"))
    c.append(Check("rss_big", "ckptfs", None, "<=", None, "daemon peak RSS (big tensor), MiB"))
    if b.have_alt:
        for key in [f"seq_first_{t}" for t in SEQ_TOOLS] + [f"reread_{t}" for t in SEQ_TOOLS] + [
                "memmap_first", "memmap_second", "rand4k", "rss_big"]:
            c.append(Check(key, "alt", "ckptfs", ">=", None, f"A/B {key}: alt / ckptfs"))
