"""The views' figures (``scripts/bench --views``): issue 15's closing note, each beside its limit in the same run.

Sides of these figures (the table's columns):

* raw         the same work on local files: ``cp`` of the ``.pt``, ``safe_open`` of a real safetensors file,
              ``cat a b``, a memmap of the tensor's range of the ``.pt``, zarr on a local copy of ``/.zarr``
* tensorfile  the tensor files of the same mount (the raw bytes, no format around them)
* ckptfs      the view through the mount (``model.safetensors``, ``NAME.npy``, ``/.zarr``) or the ckptfs command

"cold": the mounted file's page cache dropped (``posix_fadvise``, checked with ``mincore``), sources warm, as
the bench's first reads; for ``ckptfs diff`` cold means both checkpoints dropped from the page cache (read
from the disk), for ``cat`` the same. Local files (the ``.pt``, the safetensors file) stay warm: the limit.

The section's own checkpoints go to ``WORKDIR/views/``: B (the big checkpoint with one element changed, written
by torch), a checkpoint of ``MID_TENSORS`` small tensors, and both as safetensors files written by
``ckptfs convert``; copies go to ``/dev/shm`` where it has room (write-back to a disk would dominate).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np

MID_TENSORS = 1000
MID_TENSORS_QUICK = 100
VIEW_SIDES = ("raw", "tensorfile", "ckptfs")


def side_order(run_i: int) -> tuple[str, ...]:
    """The sides in this run's order: the two mounted sides swap places every other run, so that neither is
    always measured right after the other (in a fixed order the .npy, always second, read at ~0.7x the tensor
    file in every run, and at par when the two alternated outside the bench)."""
    return VIEW_SIDES if run_i % 2 == 0 else ("raw", "ckptfs", "tensorfile")

SIDE_NOTES = {"tensorfile": "tensorfile = the tensor files of the ckptfs mount whose view is measured (in those "
                            "rows ckptfs = the view, or the ckptfs command)"}
CHANGED_ELEMENT = 12345
"""The element of the big tensor that B changes (adds 1 to)."""

MAKE_B = """
import sys, torch
a, b, index = sys.argv[1], sys.argv[2], int(sys.argv[3])
sd = torch.load(a, mmap=True, weights_only=True)
((name, t),) = sd.items()
t = t.clone()
t.view(-1)[index] += 1
torch.save({name: t}, b)
"""

MAKE_MID = """
import sys
sys.path.insert(0, sys.argv[1])
import torch, torch_worker
torch.save(torch_worker.make_many(int(sys.argv[3])), sys.argv[2])
"""


class Tools(NamedTuple):
    """What the section uses of ``common.py`` (handed in by ``sections.py``)."""

    timed: Callable[..., float]
    drop_cache: Callable[[str], None]
    resident: Callable[..., float | None]
    warm: Callable[[str, int, int], None]
    log: Callable[[str], None]
    error: type[Exception]


class Files(NamedTuple):
    a: str
    b: str
    mid: str
    big_st: str
    mid_st: str


def ckptfs_command(bench: Any, *args: str) -> tuple[list[str], dict[str, str]]:
    """``ckptfs ARGS`` as the bench runs ``ckptfs mount`` (the same sources, environment and interpreter)."""
    argv, env = bench.ckptfs_argv("SRC", "MNT")
    return argv[: argv.index("mount")] + list(args), env


def run_status(argv: list[str], env: dict[str, str], ok: tuple[int, ...], tools: Tools) -> tuple[float, str]:
    """Wall seconds and standard output of one command whose exit status must be in ``ok``."""
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if proc.returncode not in ok:
        raise tools.error(f"{' '.join(argv)} exited with {proc.returncode}: {proc.stderr[-500:]}")
    return dt, proc.stdout


def prepare(bench: Any, tools: Tools) -> Files:
    """B, the mid checkpoint and their safetensors conversions, made once per work directory."""
    vdir = bench.workdir / "views"
    vdir.mkdir(exist_ok=True)
    mid_count = MID_TENSORS_QUICK if bench.args.quick else MID_TENSORS
    files = Files(bench.big, str(vdir / "b.pt"), str(vdir / "mid.pt"), str(vdir / "big.safetensors"),
                  str(vdir / "mid.safetensors"))
    manifest = vdir / "views.json"
    want = {"a_bytes": os.path.getsize(bench.big), "mid": mid_count, "version": 1}
    with contextlib.suppress(OSError, ValueError):
        if json.loads(manifest.read_text()) == want and all(map(os.path.exists, files)):
            tools.log("views: reusing B, the mid checkpoint and their conversions")
            return files
    for path in files[1:]:
        with contextlib.suppress(OSError):
            os.unlink(path)
    tools.log(f"views: writing B (A with element {CHANGED_ELEMENT} changed) and {mid_count} small tensors with torch")
    subprocess.run([sys.executable, "-c", MAKE_B, files.a, files.b, str(CHANGED_ELEMENT)], check=True)
    subprocess.run([sys.executable, "-c", MAKE_MID, str(Path(__file__).resolve().parent), files.mid,
                    str(mid_count)], check=True)
    for src, out in ((files.a, files.big_st), (files.mid, files.mid_st)):
        argv, env = ckptfs_command(bench, "convert", src, out)
        run_status(argv, env, (0,), tools)
    manifest.write_text(json.dumps(want))
    return files


def out_directory(vdir: Path, nbytes: int) -> str:
    """A new directory for copies: on tmpfs where it has room for two, so that no disk write-back is timed."""
    shm = "/dev/shm"
    room = os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 3 * nbytes
    return tempfile.mkdtemp(prefix="ckptfs-bench-views-", dir=shm if room else vdir)


def files_below(root: str, suffix: str) -> list[str]:
    """Regular files below a mount root ending with ``suffix``, outside the hidden ``.ckptfs``/``.zarr`` trees."""
    found = []
    for dirpath, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found += [os.path.join(dirpath, n) for n in sorted(names) if n.endswith(suffix)]
    return found


def _drop_checked(path: str, tools: Tools, dropped: dict[str, float]) -> None:
    tools.drop_cache(path)
    left = tools.resident(path)
    if left is not None:
        dropped[path] = max(dropped.get(path, 0.0), left)


def _cp(src: str, out_dir: str, tools: Tools) -> float:
    out = os.path.join(out_dir, "copy")
    try:
        return tools.timed(["cp", src, out])
    finally:
        with contextlib.suppress(OSError):
            os.unlink(out)


def figure_cp(bench: Any, tools: Tools, files: Files, out_dir: str, st: str, tensor: str,
              dropped: dict[str, float], run_i: int) -> None:
    """1. ``cp model.safetensors`` against ``cp`` of the .pt (warm) and of the tensor file in the same mount."""
    res = bench.res
    sizes = {"raw": os.path.getsize(files.a), "tensorfile": os.path.getsize(tensor), "ckptfs": os.path.getsize(st)}
    paths = {"raw": files.a, "tensorfile": tensor, "ckptfs": st}
    for temp in ("cold", "warm"):
        fig = res.fig(f"views_cp_{temp}", f"cp {temp}: model.safetensors (ckptfs), tensor file, .pt", "GB/s")
        for side in side_order(run_i):
            if temp == "cold" and side != "raw":
                _drop_checked(paths[side], tools, dropped)
            fig.add(side, sizes[side] / 1e9 / _cp(paths[side], out_dir, tools))


def safe_open_all(path: str, framework: str) -> tuple[float, int, int]:
    """Seconds to open a safetensors file with ``safe_open`` and get every tensor; tensors, a checksum (not timed).

    ``framework`` "np" where numpy has every dtype, else "pt" (safetensors' numpy loader refuses bfloat16)."""
    from safetensors import safe_open

    t0 = time.perf_counter()
    with safe_open(path, framework) as f:
        arrays = [f.get_tensor(key) for key in f.keys()]
    seconds = time.perf_counter() - t0
    if framework == "np":
        total = sum(int(a.reshape(-1).view(np.uint8).sum(dtype=np.uint64)) for a in arrays)
    else:
        import torch

        total = sum(int(a.reshape(-1).view(torch.uint8).sum()) for a in arrays)
    return seconds, len(arrays), total


def figure_safe_open(bench: Any, tools: Tools, local: str, mounted: str, name: str, framework: str,
                     dropped: dict[str, float], seen: dict[str, set[tuple[int, int]]]) -> None:
    """2. ``safe_open`` + ``get_tensor`` of every tensor through the mount against a local safetensors file."""
    for temp in ("cold", "warm"):
        fig = bench.res.fig(f"views_safe_open_{name}_{temp}",
                            f"safe_open({framework}) + every get_tensor, {name}, {temp}", "s")
        for side, path in (("raw", local), ("ckptfs", mounted)):
            if temp == "cold" and side == "ckptfs":
                _drop_checked(path, tools, dropped)
            seconds, count, total = safe_open_all(path, framework)
            fig.add(side, seconds)
            seen.setdefault(name, set()).add((count, total))


def figure_diff(bench: Any, tools: Tools, files: Files, out_dir: str) -> None:
    """3. ``ckptfs diff A B`` against ``cat A B`` (warm and cold); ``ckptfs convert`` against ``cp``."""
    res = bench.res
    argv, env = ckptfs_command(bench, "diff", files.a, files.b)
    for temp in ("cold", "warm"):
        fig = res.fig(f"views_diff_{temp}", f"ckptfs diff A B (ckptfs) vs cat A B (raw), {temp}", "s")
        for side in ("raw", "ckptfs"):
            for path in (files.a, files.b):
                if temp == "cold":
                    tools.drop_cache(path)
                else:
                    tools.warm(path, 0, os.path.getsize(path))
            if side == "raw":
                fig.add(side, tools.timed(["cat", files.a, files.b]))
                continue
            seconds, out = run_status(argv, env, (1,), tools)
            if "1 differ" not in out or "differs    " not in out:
                raise tools.error(f"ckptfs diff A B did not find the changed element: {out[-500:]}")
            fig.add(side, seconds)
    for path in (files.a, files.b):
        tools.warm(path, 0, os.path.getsize(path))
    fig = res.fig("views_convert", "ckptfs convert A out.safetensors (ckptfs) vs cp A out (raw), warm", "s")
    out = os.path.join(out_dir, "converted.safetensors")
    for side in ("raw", "ckptfs"):
        with contextlib.suppress(OSError):
            os.unlink(out)
        try:
            if side == "raw":
                fig.add(side, tools.timed(["cp", files.a, out]))
            else:
                argv, env = ckptfs_command(bench, "convert", files.a, out)
                fig.add(side, run_status(argv, env, (0,), tools)[0])
        finally:
            with contextlib.suppress(OSError):
                os.unlink(out)


def _memmap_sum(path: str, npy: bool, offset: int, count: int) -> tuple[float, float]:
    t0 = time.perf_counter()
    arr = np.load(path, mmap_mode="r") if npy else np.memmap(path, "<f4", "r", offset, (count,))
    total = float(arr.sum())
    dt = time.perf_counter() - t0
    del arr
    gc.collect()  # the 1 GiB mapping is gone before the next side is timed
    return dt, total


def figure_npy(bench: Any, tools: Tools, tensor: str, npy: str, dropped: dict[str, float],
               sums: set[float], run_i: int) -> None:
    """4a. ``np.load(NAME.npy, mmap_mode="r").sum()`` against the tensor file's memmap and the .pt range's."""
    count = bench.big_len // 4
    gb = bench.big_len / 1e9
    first = bench.res.fig("views_npy_first", "np.load(.npy, mmap) .sum() vs memmap of the tensor, first", "GB/s")
    second = bench.res.fig("views_npy_second", "np.load(.npy, mmap) .sum() vs memmap of the tensor, second", "GB/s")
    places = {"raw": (bench.big, bench.big_off), "tensorfile": (tensor, 0), "ckptfs": (npy, 0)}
    for side in side_order(run_i):
        path, offset = places[side]
        if side != "raw":
            _drop_checked(path, tools, dropped)
        for fig in (first, second):
            seconds, total = _memmap_sum(path, side == "ckptfs", offset, count)
            fig.add(side, gb / seconds)
            sums.add(total)


def read_zarr(root: str) -> tuple[float, int, int]:
    """Seconds to open the hierarchy at ``root`` with zarr and read every array; arrays, bytes."""
    import zarr

    t0 = time.perf_counter()
    group = zarr.open_group(root, mode="r")
    count = nbytes = 0
    for _path, member in group.members(max_depth=None):
        if isinstance(member, zarr.Array):
            nbytes += member[...].nbytes
            count += 1
    return time.perf_counter() - t0, count, nbytes


def read_tensor_files(paths: list[str]) -> tuple[float, int, int]:
    """Seconds to read every tensor file with numpy; files, bytes."""
    t0 = time.perf_counter()
    nbytes = sum(np.fromfile(path, np.uint8).nbytes for path in paths)
    return time.perf_counter() - t0, len(paths), nbytes


def figure_zarr(bench: Any, tools: Tools, root: str, local: str, tensors: list[str],
                seen: set[tuple[int, int]]) -> None:
    """4b. zarr ``open_group`` + every array read through the mount against the same on a local copy of the
    hierarchy, and against numpy reading every tensor file (all warm)."""
    fig = bench.res.fig("views_zarr", f"zarr open_group + read every array ({len(tensors)} tensors); "
                                      "tensorfile: numpy", "s")
    for side in VIEW_SIDES:
        if side == "tensorfile":
            seconds, count, nbytes = read_tensor_files(tensors)
        else:
            seconds, count, nbytes = read_zarr(local if side == "raw" else os.path.join(root, ".zarr"))
        fig.add(side, seconds)
        seen.add((count, nbytes))


def run(bench: Any, tools: Tools) -> None:
    """Every figure of the section, ``bench.args.runs`` times, side after side."""
    files = prepare(bench, tools)
    import safetensors  # noqa: F401  imported before timing: the first measured load would pay for them
    import torch  # noqa: F401
    import zarr  # noqa: F401

    for path in (files.a, files.b, files.mid, files.big_st, files.mid_st):
        tools.warm(path, 0, os.path.getsize(path))
    dropped: dict[str, float] = {}
    checks: dict[str, set[Any]] = {"npy_sums": set(), "zarr": set()}
    seen_st: dict[str, set[tuple[int, int]]] = {}
    mounts = []
    out_dir = out_directory(bench.workdir / "views", bench.big_len)
    try:
        big = bench.mount_ckptfs(files.a, "ckptfs-views-big")
        mounts.append(big)
        mid = bench.mount_ckptfs(files.mid, "ckptfs-views-mid")
        mounts.append(mid)
        big_st = os.path.join(big.mnt, "model.safetensors")
        npy = files_below(big.mnt, ".npy")
        if len(npy) != 1:
            raise tools.error(f"{big.mnt}: expected one .npy, found {npy[:5]}")
        tensor = npy[0][: -len(".npy")]
        mid_tensors = [p[: -len(".npy")] for p in files_below(mid.mnt, ".npy")]
        local_zarr = str(bench.workdir / "views" / "mid.zarr")
        shutil.rmtree(local_zarr, ignore_errors=True)
        shutil.copytree(os.path.join(mid.mnt, ".zarr"), local_zarr, symlinks=True, copy_function=shutil.copyfile)
        for folder, _, _ in os.walk(local_zarr):
            os.chmod(folder, 0o755)  # copied from the mount's 0555: a user other than root could not delete it
        for run_i in range(bench.args.runs):
            tools.log(f"views, run {run_i + 1}/{bench.args.runs}")
            figure_cp(bench, tools, files, out_dir, big_st, tensor, dropped, run_i)
            figure_safe_open(bench, tools, files.big_st, big_st, "big", "np", dropped, seen_st)
            figure_safe_open(bench, tools, files.mid_st, os.path.join(mid.mnt, "model.safetensors"), "mid", "pt",
                             dropped, seen_st)
            figure_npy(bench, tools, tensor, npy[0], dropped, checks["npy_sums"], run_i)
            figure_zarr(bench, tools, mid.mnt, local_zarr, mid_tensors, checks["zarr"])
            figure_diff(bench, tools, files, out_dir)
    finally:
        for m in reversed(mounts):
            bench.mounts.stop(m)
        shutil.rmtree(out_dir, ignore_errors=True)
    for name, values in seen_st.items():
        if len(values) != 1:
            raise tools.error(f"safe_open of the {name} checkpoint: the mount and the local file differ: {values}")
    if len(checks["npy_sums"]) != 1:
        raise tools.error(f"memmap sums differ between .pt, tensor file and .npy: {checks['npy_sums']}")
    if len(checks["zarr"]) != 1:
        raise tools.error(f"zarr and the tensor files differ in arrays or bytes: {checks['zarr']}")
    bench.res.meta["views"] = {
        "files": files._asdict(), "copies_to": os.path.dirname(out_dir), "mid_tensors": len(mid_tensors),
        "resident_after_drop_max": max(dropped.values(), default=None),
        "safe_open_tensors": {name: next(iter(v))[0] for name, v in seen_st.items()},
        "zarr_arrays": next(iter(checks["zarr"]))[0]}
    if any(v > 0.01 for v in dropped.values()):
        tools.log(f"warning: views: page cache not fully dropped: {dropped}")


def define_checks(bench: Any, check: Callable[..., Any]) -> None:
    """The section's ratios (``check(figure, num, den, op, target, label)``), per run, median shown."""
    c = bench.res.checks
    for temp in ("cold", "warm"):
        c.append(check(f"views_cp_{temp}", "ckptfs", "tensorfile", ">=", 0.9,
                       f"cp {temp}: model.safetensors / tensor file (same mount)"))
        c.append(check(f"views_cp_{temp}", "ckptfs", "raw", ">=", None, f"cp {temp}: model.safetensors / .pt"))
        c.append(check(f"views_cp_{temp}", "tensorfile", "raw", ">=", None, f"cp {temp}: tensor file / .pt"))
        for name in ("big", "mid"):
            c.append(check(f"views_safe_open_{name}_{temp}", "ckptfs", "raw", "<=", None,
                           f"safe_open all, {name}, {temp}: mount / local file (time)"))
        c.append(check(f"views_diff_{temp}", "ckptfs", "raw", "<=", None,
                       f"ckptfs diff / cat A B, {temp} (time)"))
    c.append(check("views_convert", "ckptfs", "raw", "<=", None, "ckptfs convert / cp (time)"))
    for when in ("first", "second"):
        c.append(check(f"views_npy_{when}", "ckptfs", "tensorfile", ">=", 0.9,
                       f".npy memmap sum {when} / tensor file memmap"))
        c.append(check(f"views_npy_{when}", "ckptfs", "raw", ">=", None, f".npy memmap sum {when} / .pt range"))
    c.append(check("views_zarr", "ckptfs", "raw", "<=", None, "zarr read all: mount / local copy (time)"))
    c.append(check("views_zarr", "ckptfs", "tensorfile", "<=", None, "zarr read all / numpy on tensor files (time)"))
