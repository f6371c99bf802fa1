"""The write-fill figure (``scripts/bench --sections write-fill``): filling a ``skip_data`` skeleton through a
``ckptfs mount -o rw`` with ``dd bs=1M``, beside ``dd`` into a plain file on the same disk (issue 26's target:
≥ 0.8× its throughput).

Both sides write the same source file (kept in the page cache) in place (``conv=notrunc``) into a sparse copy of
the skeleton made afresh each run, and end with ``fsync`` (``conv=fsync``): the bytes are on the disk when dd
returns. The ckptfs side also sets the record's CRC-32 (computed as the bytes arrive, in order) when dd closes
the file; ``umount`` (timed apart: it waits for the daemon to sync and let go of the file) is reported beside.
The order of the sides alternates from run to run; the ratio is the median of per-run ratios, so drift cancels.
The skeleton is made by torch without allocating its tensor (a FakeTensor, ``materialize_fake_tensors``).

A third side, ``floor``, is the same ``dd`` through the C pass-through file system (``passthrough.c``, mode
``write``: each write request a ``pwrite`` at the storage's offset, no CRC, no Python), mounted as ckptfs mounts
``-o rw`` (1 MiB write requests, no page cache kept between opens): what any FUSE file system can do here.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MIB = 1 << 20
SIZE_MIB = 4096
SIZE_MIB_QUICK = 256
SKELETON = """
import sys, torch
from torch._subclasses.fake_tensor import FakeTensorMode
with FakeTensorMode():
    weight = torch.empty(int(sys.argv[2]) << 18, dtype=torch.float32)
with torch.serialization.skip_data(materialize_fake_tensors=True):
    torch.save({"weight": weight}, sys.argv[1])
"""


def make_inputs(directory: Path, mib: int) -> tuple[Path, Path]:
    """The skeleton of one float32 tensor of ``mib`` MiB, and a source file of its bytes."""
    directory.mkdir(parents=True, exist_ok=True)
    skeleton, source = directory / "skeleton.pt", directory / "source.bin"
    if not skeleton.exists():
        subprocess.run([sys.executable, "-c", SKELETON, str(skeleton), str(mib)], check=True)
    if not source.exists() or source.stat().st_size != mib * MIB:
        block = os.urandom(MIB)
        with open(source, "wb") as f:
            for _ in range(mib):
                f.write(block)
    return skeleton, source


def _timed(argv: list[str], env: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def _fresh_copy(skeleton: Path, target: Path) -> None:
    target.unlink(missing_ok=True)
    subprocess.run(["cp", "--sparse=always", str(skeleton), str(target)], check=True)


def _floor_binary(directory: Path) -> str:
    out = directory / "passthrough"
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "fuse3"], check=True, capture_output=True,
                           text=True).stdout.split()
    subprocess.run(["gcc", "-O2", "-Wall", str(Path(__file__).with_name("passthrough.c")), *flags, "-o", str(out)],
                   check=True)
    return str(out)


def _floor_dd(binary: str, target: Path, offset: int, length: int, mnt: Path, dd: list[str]) -> float:
    """``dd`` through the C pass-through file system over ``target``'s storage range, unmounted after."""
    daemon = subprocess.Popen([binary, str(target), str(offset), str(length), "weight", "write", str(mnt), "-f", "-s",
                               "-o", "fsname=cfloor"])
    try:
        deadline = time.monotonic() + 10
        while not os.path.ismount(mnt):
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the C pass-through did not mount {mnt}")
            time.sleep(0.01)
        return _timed([*dd, f"of={mnt / 'weight'}"])
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)], check=False)
        daemon.wait(10)


def measure(directory: Path, mib: int, runs: int, ckptfs: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Per-run seconds of each side; ``ckptfs``: the command that runs ckptfs (``python -m ckptfs.cli``)."""
    skeleton, source = make_inputs(directory, mib)
    binary = _floor_binary(directory)
    subprocess.run(["cat", str(source)], check=True, stdout=subprocess.DEVNULL)  # warm: both sides read it so
    plain, filled, mnt = directory / "plain.pt", directory / "filled.pt", directory / "mnt"
    mnt.mkdir(exist_ok=True)
    dd = ["dd", f"if={source}", "bs=1M", "conv=notrunc,fsync", "status=none"]
    offset = _data_offset(skeleton, ckptfs, env)
    floor = directory / "floor.pt"
    figures: dict[str, list[float]] = {"plain": [], "ckptfs": [], "umount": [], "floor": []}
    for run in range(runs):
        for side in (("plain", "ckptfs", "floor") if run % 2 == 0 else ("floor", "ckptfs", "plain")):
            if side == "plain":
                _fresh_copy(skeleton, plain)
                figures["plain"].append(_timed([*dd, f"of={plain}", f"seek={offset}", "oflag=seek_bytes"]))
                continue
            if side == "floor":
                _fresh_copy(skeleton, floor)
                figures["floor"].append(_floor_dd(binary, floor, offset, mib * MIB, mnt, dd))
                continue
            _fresh_copy(skeleton, filled)
            subprocess.run([*ckptfs, "mount", "-o", "rw", str(filled), str(mnt)], check=True, env=env)
            try:
                figures["ckptfs"].append(_timed([*dd, f"of={mnt / 'weight'}"]))
            finally:
                figures["umount"].append(_timed([*ckptfs, "umount", str(mnt)], env=env))
    _check_filled(filled, [plain, floor], source, offset)
    ratios = [p / c for p, c in zip(figures["plain"], figures["ckptfs"])]
    floor_ratios = [f / c for f, c in zip(figures["floor"], figures["ckptfs"])]
    return {"mib": mib, "runs": runs, **figures, "ratio": statistics.median(ratios), "ratios": ratios,
            "floor_ratio": statistics.median(floor_ratios), "floor_ratios": floor_ratios}


def _data_offset(skeleton: Path, ckptfs: list[str], env: dict[str, str]) -> int:
    import json

    info = subprocess.run([*ckptfs, "info", "--json", str(skeleton)], check=True, capture_output=True, text=True,
                          env=env).stdout
    return json.loads(info)["storages"][0]["offset"]


def _check_filled(filled: Path, others: list[Path], source: Path, offset: int) -> None:
    """Every side wrote the source's bytes at the storage's offset; the filled one's CRC checks (zipfile)."""
    import zipfile

    for written in (filled, *others):
        with open(written, "rb") as a, open(source, "rb") as s:
            for position in range(0, source.stat().st_size, 64 * MIB):
                want = s.read(64 * MIB)
                if os.pread(a.fileno(), len(want), offset + position) != want:
                    raise RuntimeError(f"{written} differs from {source} at +{position}")
    with zipfile.ZipFile(filled) as archive:
        name = next(n for n in archive.namelist() if n.endswith("/data/0"))
        with archive.open(name) as record:
            while record.read(64 * MIB):  # raises on a bad CRC at the end
                pass


def table(result: dict[str, Any]) -> str:
    median = {side: statistics.median(result[side]) for side in ("plain", "ckptfs", "umount", "floor")}
    mib = result["mib"]
    lines = [f"write-fill: a {mib:,} MiB skip_data skeleton filled with dd bs=1M conv=notrunc,fsync "
             f"({result['runs']} runs, medians)",
             f"  dd into a plain file      {median['plain']:7.2f} s  {mib / median['plain']:8.1f} MiB/s",
             f"  dd through -o rw          {median['ckptfs']:7.2f} s  {mib / median['ckptfs']:8.1f} MiB/s",
             f"  then ckptfs umount        {median['umount']:7.2f} s",
             f"  dd through the C floor    {median['floor']:7.2f} s  {mib / median['floor']:8.1f} MiB/s",
             f"  throughput ratio ckptfs/plain (median of per-run ratios): {result['ratio']:.2f}  (target >= 0.8)",
             f"  throughput ratio ckptfs/C floor (median of per-run ratios): {result['floor_ratio']:.2f}",
             f"  throughput ratio C floor/plain: {median['plain'] / median['floor']:.2f}"]
    return "\n".join(lines)


def run(bench: Any) -> str:
    """The section, as ``scripts/bench`` runs it: in its work directory, ckptfs from its source tree."""
    args = bench.args
    mib = SIZE_MIB_QUICK if args.quick else SIZE_MIB
    root = Path(args.ckptfs_root or Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": str(root)}
    result = measure(bench.workdir / "write-fill", mib, args.runs, [sys.executable, "-m", "ckptfs.cli"], env)
    bench.res.meta["write_fill"] = result
    return table(result)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=SIZE_MIB)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workdir", default="/var/tmp/ckptfs-write-fill")
    parsed = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    print(table(measure(Path(parsed.workdir), parsed.mib, parsed.runs, [sys.executable, "-m", "ckptfs.cli"], env)))
