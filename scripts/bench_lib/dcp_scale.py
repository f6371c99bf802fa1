"""DCP rows of the scale section (``--sections scale``): opening a torch.distributed.checkpoint directory of
100,000 tensors, beside torch's ``FileSystemReader(path).read_metadata()`` in the same run.

* ``scale_dcp_open``   one rank: one ``.metadata`` (~23 MB) and one ``.distcp``
* ``scale_dcp8_open``  the same 100,000 tensors over 8 ranks' files (expert parallel: tensor n whole on rank n % 8)
* ``scale_dcp_mount``  one rank: ``ckptfs mount`` (no metadata cache) until it returns and the root lists, beside
                       the C floor (``listing.c``) showing the same root entries; ``scale_dcp_mount_over_clist``:
                       ckptfs's seconds beyond it (target 1.5 s)

The ``.metadata`` is what ``FileSystemWriter.finish`` pickles (``pickle.dump`` of torch's own ``Metadata``, made
here with torch's classes, MoE names, fp32/bf16/fp16/int8); the ``.distcp`` files are sparse, of the sizes the
byte ranges need (opening reads only the metadata and the files' sizes). Each side runs in a fresh process, the
sides alternate within a run, and the figure is that process's CPU time for the open alone (after imports), so
a loaded machine moves both alike. Standalone: ``.venv/bin/python scripts/bench_lib/dcp_scale.py [--runs N]
[--tensors N] [--workdir DIR] [--baseline TREE] [--breakdown]`` prints the medians and ratios (and the CPU µs
per tensor of each phase); with ``--mount``, the one-rank mount ready instead, of this tree, ``--baseline``'s and
the C floor, in turn within each run (``mount --no-cache``, both trees' modules byte-compiled beforehand into a
directory of the work directory, as a pip install leaves them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from common import log, write_root_entries
from results import Check

TENSORS = 100_000
QUICK_TENSORS = 10_000
TARGET = 0.25
"""ckptfs' open over torch's ``read_metadata()`` (issue 24)."""
MOUNT_OVER_CLIST = 1.5
"""Issue 24: seconds the one-rank mount ready may take beyond the C floor's."""
CASES = {"scale_dcp_open": 1, "scale_dcp8_open": 8}
FORMAT_VERSION = 1


def tensors(args: Any) -> int:
    return QUICK_TENSORS if getattr(args, "quick", False) else TENSORS


def define_checks(bench: Any) -> None:
    n = tensors(bench.args)
    bench.res.checks.append(Check("scale_dcp_mount", "ckptfs", None, "<=", None,
                                  f"DCP mount ready, {n} tensors (one rank), seconds"))
    bench.res.checks.append(Check("scale_dcp_mount", "clist", None, "<=", None,
                                  f"C floor (listing.c) of the same root, {n} tensors, seconds"))
    bench.res.checks.append(Check("scale_dcp_mount_over_clist", "ckptfs", None, "<=",
                                  MOUNT_OVER_CLIST if n >= TENSORS else None,
                                  f"DCP mount ready, {n} tensors (one rank): seconds beyond the C floor's"))
    for key, ranks in CASES.items():
        where = "one rank" if ranks == 1 else f"{ranks} ranks' files"
        bench.res.checks.append(Check(key, "ckptfs", "torch", "<=", TARGET if n >= TENSORS else None,
                                            f"DCP open, {n} tensors over {where} / torch read_metadata()"))
        bench.res.checks.append(Check(key, "ckptfs", None, "<=", None, f"DCP open, {n} tensors ({where}), "
                                                                              "CPU s"))


def run(bench: Any) -> None:
    n = tensors(bench.args)
    if bench.have_ckptfs:
        _mount(bench, ensure(bench.workdir, n, 1), n)
    for key, ranks in CASES.items():
        path = ensure(bench.workdir, n, ranks)
        figure = bench.res.fig(key, f"DCP open, {n} tensors, {ranks} rank(s)", "s")
        for run_i in range(bench.args.runs):
            log(f"DCP {n} tensors over {ranks} rank(s), run {run_i + 1}/{bench.args.runs}")
            for side in (("ckptfs", "torch") if run_i % 2 == 0 else ("torch", "ckptfs")):
                figure.add(side, measure(side, path))


def _mount(bench: Any, path: Path, n: int) -> None:
    ready = bench.res.fig("scale_dcp_mount", f"DCP mount ready, {n} tensors, one rank", "s")
    over = bench.res.fig("scale_dcp_mount_over_clist", f"DCP mount ready, {n} tensors: beyond the C floor's", "s")
    listing = bench.workdir / f"root-entries-dcp-{n}.txt"
    for run_i in range(bench.args.runs):
        log(f"DCP {n} tensors, one rank: mount ready, run {run_i + 1}/{bench.args.runs}")
        m = bench.mount_ckptfs(str(path), "ckptfs-dcp-scale")
        try:
            ready.add("ckptfs", m.ready_s)
            if run_i == 0:
                write_root_entries(m.mnt, listing)
        finally:
            bench.mounts.stop(m)
        m = bench.mount_clist(listing, "clist-dcp-scale")
        try:
            ready.add("clist", m.ready_s)
        finally:
            bench.mounts.stop(m)
        over.add("ckptfs", ready.values["ckptfs"][-1] - m.ready_s)


def ensure(workdir: Path, count: int, ranks: int) -> Path:
    path = workdir / f"dcp-{count}-{ranks}"
    stamp = path / "bench.json"
    want = {"tensors": count, "ranks": ranks, "version": FORMAT_VERSION}
    try:
        if json.loads(stamp.read_text()) == want:
            return path
    except (OSError, ValueError):
        pass
    subprocess.run([sys.executable, __file__, "--write", str(path), str(count), str(ranks)], check=True)
    stamp.write_text(json.dumps(want))
    return path


def measure(side: str, path: Path, pythonpath: str | None = None) -> float:
    """Seconds of one open in a fresh process; ``pythonpath``: ckptfs from another tree (``--baseline``)."""
    env = dict(os.environ, PYTHONPATH=pythonpath) if pythonpath else None
    out = subprocess.run([sys.executable, __file__, "--open", side, str(path)], check=True, capture_output=True,
                         text=True, env=env).stdout
    return float(json.loads(out.splitlines()[-1])["seconds"])


def _names(count: int) -> list[str]:
    names: list[str] = []
    layer = 0
    while len(names) < count:
        names += [f"model.layers.{layer}.mlp.experts.{e}.w{k}.weight" for e in range(64) for k in (1, 2, 3)]
        layer += 1
    return names[:count]


def write(path: Path, count: int, ranks: int) -> None:
    """What ``FileSystemWriter.finish`` writes for this state dict: ``pickle.dump(metadata)``."""
    import pickle

    import torch
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        StorageMeta,
        TensorProperties,
        TensorStorageMetadata,
    )

    path.mkdir(parents=True, exist_ok=True)
    dtypes = (torch.float32, torch.bfloat16, torch.float16, torch.int8)
    files = [f"__{r}_0.distcp" for r in range(ranks)]
    ends = [0] * ranks
    items, storage, planner = {}, {}, {}
    for n, name in enumerate(_names(count)):
        size, dtype, rank = torch.Size((8, 4 + n % 3)), dtypes[n % 4], n % ranks
        offsets = torch.Size((0, 0))
        length = 1500 + size.numel() * dtype.itemsize  # a torch.save blob of the tensor
        storage[MetadataIndex(name, offsets, 0)] = _StorageInfo(files[rank], ends[rank], length)
        ends[rank] += length
        items[name] = TensorStorageMetadata(TensorProperties.create_from_tensor(torch.empty(0, dtype=dtype)), size,
                                            [ChunkStorageMetadata(offsets, torch.Size(size))])
        planner[name] = (name,)
    metadata = Metadata(items, planner, storage, StorageMeta(checkpoint_id=str(path), save_id="bench"))
    metadata.version = "1.0.0"
    for name, end in zip(files, ends):
        with open(path / name, "wb") as f:
            f.truncate(end)
    with open(path / ".metadata", "wb") as f:
        pickle.dump(metadata, f)


def open_once(side: str, path: str) -> float:
    import time

    if side == "torch":
        from torch.distributed.checkpoint import FileSystemReader

        start = time.process_time()
        count = len(FileSystemReader(path).read_metadata().state_dict_metadata)
    else:
        import ckptfs
        import ckptfs.checkpoint  # noqa: F401  (the modules an open of a DCP directory uses, as torch's are above)
        import ckptfs.formats.dcp_directory  # noqa: F401
        from ckptfs.gc_pause import gc_paused

        start = time.process_time()
        with gc_paused(), ckptfs.open(path) as ck:  # as ``ckptfs mount`` and the CLI open
            count = len(ck)
    elapsed = time.process_time() - start
    assert count > 0
    return elapsed


def breakdown(path: str, count: int, runs: int = 3) -> str:
    """CPU µs per tensor of each phase of an open (medians of ``runs`` in this process): the compiled scan of the
    pickle (with its join into direct rows), the rows to the tree (``dcp_tree``), the rest; beside them, what
    ``dcp_metadata.parse_metadata`` takes (the records: the rows made into them, the pure-Python fast and reference
    pickle paths), which an open takes only for items the direct rows do not make."""
    import time

    import ckptfs
    from ckptfs.formats import dcp_directory, dcp_metadata
    from ckptfs.gc_pause import gc_paused
    from ckptfs.limits import Limits
    from ckptfs.pickle import cscan, unpickler
    from ckptfs.sources import DirectorySource

    data = Path(path, ".metadata").read_bytes()
    steps = {
        "scan": lambda: cscan.dcp(data, Limits()),
        "pickle": lambda: unpickler.load_dcp(data, Limits()),
        "pickle_reference": lambda: unpickler.load_dcp(data, Limits()),
        "parse_metadata": lambda: dcp_metadata.parse_metadata(data, Limits()),
        "open_dcp": lambda: dcp_directory.open_dcp(DirectorySource(path), Limits()),
        "ckptfs.open": lambda: ckptfs.open(path).close(),
    }
    times: dict[str, list[float]] = {name: [] for name in steps}
    with gc_paused():
        for _ in range(runs):
            for name, step in steps.items():
                unpickler.FAST_PATHS = name != "pickle_reference"
                start = time.process_time()
                step()
                times[name].append(time.process_time() - start)
    unpickler.FAST_PATHS = True
    us = {name: statistics.median(values) / count * 1e6 for name, values in times.items()}
    return (f"us per tensor ({cscan.active_path()}): scan {us['scan']:.1f}, rows to the tree "
            f"{us['open_dcp'] - us['scan']:.1f}, rest of ckptfs.open {us['ckptfs.open'] - us['open_dcp']:.1f}; "
            f"total {us['ckptfs.open']:.1f} (beside it: rows to records {us['parse_metadata'] - us['scan']:.1f}; "
            f"pure-Python pickle: fast path {us['pickle']:.1f}, reference {us['pickle_reference']:.1f})")


def mount_ready(workdir: Path, path: Path, runs: int, baseline: str | None) -> None:
    """Seconds until ``ckptfs mount --no-cache`` returned and the root listed, of this tree (and ``baseline``'s),
    and of the C floor (``listing.c``) showing the root ckptfs showed; medians and each side beyond the floor (the
    floor of the same run)."""
    from common import LIB, REPO, run
    from mounts import MountManager

    work = workdir / "dcp-mount"
    (work / "bin").mkdir(parents=True, exist_ok=True)
    flags = run(["pkg-config", "--cflags", "--libs", "fuse3"], capture_output=True, text=True).stdout.split()
    listing_c = str(work / "bin" / "listing")
    run(["gcc", "-O2", "-Wall", str(LIB / "listing.c"), *flags, "-o", listing_c])
    trees = {"ckptfs": str(REPO), **({"baseline": baseline} if baseline else {})}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPYCACHEPREFIX=str(work / "pycache"), XDG_CACHE_HOME=str(work / "no-cache"))
    for tree in trees.values():
        run([sys.executable, "-m", "compileall", "-q", str(Path(tree) / "ckptfs")], env=env)
    mounts, entries = MountManager(work), work / f"root-entries-{path.name}.txt"
    ready: dict[str, list[float]] = {side: [] for side in [*trees, "clist"]}
    try:
        for run_i in range(-1, runs):  # run -1 is not counted: it warms what each side reads at its start
            sides = list(ready)[run_i % len(ready):] + list(ready)[: run_i % len(ready)]
            for side in sides if run_i >= 0 else ["ckptfs", *[s for s in sides if s != "ckptfs"]]:
                mnt = str(work / "mnt" / side)
                if side == "clist":
                    m = mounts.start(side, [listing_c, str(entries), mnt, "-f", "-s", "-o", "ro,fsname=listing"], mnt)
                else:
                    argv = [sys.executable, "-P", "-m", "ckptfs.cli", "mount", "--no-cache", str(path), mnt]
                    m = mounts.start(side, argv, mnt, env=dict(env, PYTHONPATH=trees[side]), daemon=True)
                    if run_i < 0 and side == "ckptfs":
                        write_root_entries(m.mnt, entries)
                mounts.stop(m)
                if run_i >= 0:
                    ready[side].append(m.ready_s)
    finally:
        mounts.stop_all()
    print(f"scale_dcp_mount (one rank, {path.name}), seconds per run: {ready}")
    floor = ready["clist"]
    for side in trees:
        beyond = statistics.median(r - f for r, f in zip(ready[side], floor))
        print(f"  {side}: ready median {statistics.median(ready[side]):.2f} s, C floor {statistics.median(floor):.2f} "
              f"s, beyond it median {beyond:.2f} s (target <= {MOUNT_OVER_CLIST})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--write", nargs=3, metavar=("PATH", "TENSORS", "RANKS"), help=argparse.SUPPRESS)
    p.add_argument("--open", nargs=2, metavar=("SIDE", "PATH"), help=argparse.SUPPRESS)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--tensors", type=int, default=TENSORS)
    p.add_argument("--breakdown", action="store_true", help="also each phase's CPU us per tensor (this tree)")
    p.add_argument("--baseline", metavar="TREE", help="also open with the ckptfs of this source tree (before/after)")
    p.add_argument("--mount", action="store_true", help="the one-rank mount ready instead (beside the C floor)")
    p.add_argument("--workdir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "ckptfs-dcp-bench")
    a = p.parse_args()
    if a.mount:
        mount_ready(a.workdir, ensure(a.workdir, a.tensors, 1), a.runs, a.baseline)
        return
    if a.write:
        write(Path(a.write[0]), int(a.write[1]), int(a.write[2]))
        return
    if a.open:
        print(json.dumps({"seconds": open_once(a.open[0], a.open[1])}))
        return
    for key, ranks in CASES.items():
        path = ensure(a.workdir, a.tensors, ranks)
        sides = ["ckptfs", "torch"] + (["baseline"] if a.baseline else [])
        values: dict[str, list[float]] = {side: [] for side in sides}
        for run_i in range(a.runs):
            for side in sides[run_i % len(sides):] + sides[: run_i % len(sides)]:
                values[side].append(measure("ckptfs" if side == "baseline" else side, path,
                                            a.baseline if side == "baseline" else None))
        print(f"{key} ({a.tensors} tensors, {ranks} rank(s)), CPU s per run: {values}")
        for side in sides:
            if side != "torch":
                ratios = [c / t for c, t in zip(values[side], values["torch"])]
                print(f"  {side}: median {statistics.median(values[side]):.2f} s, torch read_metadata "
                      f"{statistics.median(values['torch']):.2f} s, {side}/torch median "
                      f"{statistics.median(ratios):.2f} (target <= {TARGET})")
        if a.breakdown:
            print("  " + breakdown(str(path), a.tensors))


if __name__ == "__main__":
    main()
