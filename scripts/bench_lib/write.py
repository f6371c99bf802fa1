"""The write section of scripts/bench (``--sections write``): ``ckptfs convert DCP_DIR OUT.pt`` of a DCP directory
sharded over 2 ranks (4 GiB of tensors; ``--quick``: 256 MiB), side by side with

* ``cp``     ``cp -r`` of the directory: the cost of moving the bytes at all;
* ``torch``  ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save`` (the call alone, timed in its own
             process after ``import torch``), which loads every tensor before it saves.

Every side ends with its output on disk: ckptfs fsyncs before its rename; ``cp`` and torch are followed by
``sync`` of what they wrote, counted in their time. The source is read into the page cache before each side.
Peak RSS is each process's own (``wait4``'s ``ru_maxrss``): ckptfs's whole command, torch's process
(``import torch`` included). Outputs are deleted after each side; the directory at the end unless ``--keep``.

Figures: ``write_time`` (s: ckptfs, cp, torch), ``write_rss`` (MiB: ckptfs, torch); checks: ckptfs / cp
<= 1.2, ckptfs / torch <= 0.5, ckptfs RSS <= 300 MiB. Run as a script, this module makes the directory
(``make DIR MIB``) or runs torch's side (``torch DIR OUT``) in a fresh process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import log, made_as, made_before, warm
from results import Check

MIB = 1 << 20
SIZE_MIB = 4096
QUICK_MIB = 256
TENSORS = 16
TARGETS = {"cp": 1.2, "torch": 0.5, "rss": 300.0}
"""The issue's targets: time ratios to cp -r and to dcp_to_torch_save, ckptfs's peak RSS in MiB."""
LIMITS = {"cp": "cp -r", "torch": "dcp_to_torch_save"}
SIDE_NOTES = {"cp": "cp = cp -r of the DCP directory, then sync (write section; there torch = dcp_to_torch_save)"}


def define_checks(bench: Any) -> None:
    size = _size_mib(bench.args)
    checks = bench.res.checks
    full = size >= SIZE_MIB
    for side in ("cp", "torch"):
        checks.append(Check("write_time", "ckptfs", side, "<=", TARGETS[side] if full else None,
                                  f"convert DCP ({size} MiB, 2 ranks) to .pt / {LIMITS[side]}"))
    checks.append(Check("write_time", "ckptfs", None, "<=", None, f"convert DCP ({size} MiB) to .pt, seconds"))
    checks.append(Check("write_rss", "ckptfs", None, "<=", TARGETS["rss"], f"convert peak RSS ({size} MiB), MiB"))
    checks.append(Check("write_rss", "torch", None, "<=", None, f"dcp_to_torch_save peak RSS ({size} MiB), MiB"))


def _size_mib(args: Any) -> int:
    return QUICK_MIB if args.quick else SIZE_MIB


def _run_with_rusage(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """Wall seconds, the process's own peak RSS (MiB) and its stdout: reaped with wait4 for its own usage."""
    start = time.perf_counter()
    read, write = os.pipe()
    pid = os.posix_spawn(argv[0], argv, env if env is not None else dict(os.environ),
                         file_actions=[(os.POSIX_SPAWN_DUP2, write, 1), (os.POSIX_SPAWN_CLOSE, read)])
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    _, status, usage = os.wait4(pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(argv)} failed with {os.waitstatus_to_exitcode(status)}")
    return seconds, usage.ru_maxrss / 1024, b"".join(chunks).decode()


def _warm(directory: Path) -> None:
    for path in directory.iterdir():
        warm(str(path), 0, path.stat().st_size)


def make(directory: Path, mib: int) -> None:
    """A DCP directory of ``TENSORS`` float32 tensors of ``mib`` MiB in all, each cut along dim 0 over 2 ranks."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    import torch
    from dcp_writers import simulate_ranks

    rows = mib * MIB // TENSORS // 4 // 1024
    gen = torch.Generator().manual_seed(26)
    state = {f"layers.{i}.weight": torch.empty(rows, 1024).uniform_(generator=gen) for i in range(TENSORS)}
    state["step"] = 1000
    simulate_ranks(state, {name: (0, 2) for name in state if name != "step"}, directory, world=2)


def torch_side(directory: Path, out: Path) -> None:
    import warnings

    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp_to_torch_save(directory, out)
    print(json.dumps({"seconds": time.perf_counter() - start}))


def run(bench: Any) -> None:
    a = bench.args
    size = _size_mib(a)
    source = bench.workdir / f"dcp-{size}"
    manifest = bench.workdir / f"dcp-{size}.json"
    want = {"mib": size, "tensors": TENSORS, "version": 1}
    if not made_before(manifest, want, source):
        log(f"creating a {size} MiB DCP directory over 2 ranks with torch")
        subprocess.run([sys.executable, __file__, "make", str(source), str(size)], check=True)
        made_as(manifest, want)
    files = list(source.iterdir())
    bench.res.meta.setdefault("checkpoints", {})["dcp_write"] = {
        "path": str(source), "size": sum(p.stat().st_size for p in files), "files": len(files)}
    times = bench.res.fig("write_time", f"convert a {size} MiB DCP directory (2 ranks) to one file, on disk", "s")
    rss = bench.res.fig("write_rss", f"peak RSS converting {size} MiB of DCP", "MiB")
    out = bench.workdir / "written"
    argv, env = bench.ckptfs_argv(str(source), "MNT")
    convert = argv[: argv.index("mount")] + ["convert", str(source), str(out / "model.pt")]
    for run_i in range(a.runs):
        log(f"write section, run {run_i + 1}/{a.runs}")
        for side in ("ckptfs", "cp", "torch"):
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            _warm(source)
            if side == "ckptfs":
                seconds, peak, _ = _run_with_rusage(convert, env)
                rss.add(side, peak)
            elif side == "cp":
                start = time.perf_counter()
                subprocess.run(["cp", "-r", str(source), str(out / "copy")], check=True)
                subprocess.run(["sync", *map(str, (out / "copy").iterdir())], check=True)
                seconds = time.perf_counter() - start
            else:
                _, peak, printed = _run_with_rusage([sys.executable, __file__, "torch", str(source),
                                                     str(out / "model.pt")])
                start = time.perf_counter()
                subprocess.run(["sync", str(out / "model.pt")], check=True)
                seconds = json.loads(printed)["seconds"] + time.perf_counter() - start
                rss.add(side, peak)
            times.add(side, seconds)
            log(f"  {side}: {seconds:.2f} s")
    shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(Path(sys.argv[2]), int(sys.argv[3]))
    else:
        torch_side(Path(sys.argv[2]), Path(sys.argv[3]))
