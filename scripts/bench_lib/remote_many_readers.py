"""Many readers on one remote mount: 8 processes, each ``dd bs=1M`` of a different 16 MiB tensor, through one
fresh mount of an s3:// checkpoint served by nginx on loopback (optionally capping each connection,
``limit_rate``), with the default FUSE loop (threads taking turns on a remote mount, ``fuse.turns``) and
``--multithreaded`` (libfuse's), optionally another tree's mounts too (``--against``), against obstore fetching
the same 8 ranges concurrently. Alternating runs, medians of the aggregate rate.

    PYTHONPATH=$PWD .venv/bin/python scripts/bench_lib/remote_many_readers.py [--runs 5] [--limit-rate 40m] \
        [--against OTHER_TREE]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from remote_servers import Nginx, stop  # noqa: E402

MiB = 1 << 20
READERS = 8
TENSOR = 16 * MiB


def make_checkpoint(path: Path) -> list[tuple[int, int]]:
    """A state dict of READERS float32 tensors of TENSOR bytes; their (offset, length) in the file."""
    import torch

    generator = torch.Generator().manual_seed(25)
    torch.save({f"t{i}": torch.randn(TENSOR // 4, generator=generator) for i in range(READERS)}, path)
    spans = []
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if "/data/" in info.filename:
                with open(path, "rb") as f:
                    f.seek(info.header_offset + 26)
                    name_len, extra_len = (int.from_bytes(f.read(2), "little") for _ in range(2))
                spans.append((info.header_offset + 30 + name_len + extra_len, info.file_size))
    return spans


def mount(url: str, endpoint: str, mnt: str, threaded: bool, root: str | None) -> None:
    argv = [sys.executable, "-m", "ckptfs.cli", "mount", url, mnt, "--endpoint-url", endpoint, "--anonymous",
            *(["--multithreaded"] if threaded else [])]
    env = {**os.environ, "XDG_CACHE_HOME": tempfile.mkdtemp()}
    if root is not None:
        env["PYTHONPATH"] = os.pathsep.join([root, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]])
    subprocess.run(argv, check=True, env=env)


def readers_through(mnt: str) -> float:
    files = sorted(str(p) for p in Path(mnt).rglob("*") if p.is_file() and p.stat().st_size == TENSOR)
    assert len(files) == READERS, files
    started = time.perf_counter()
    procs = [subprocess.Popen(["dd", f"if={f}", "of=/dev/null", "bs=1M"], stderr=subprocess.DEVNULL) for f in files]
    if any(p.wait() for p in procs):
        raise RuntimeError("a dd failed")
    return READERS * TENSOR / (time.perf_counter() - started) / 1e6


def obstore_readers(endpoint: str, spans: list[tuple[int, int]]) -> float:
    import obstore
    from obstore.store import S3Store

    store = S3Store("bkt", endpoint=endpoint, virtual_hosted_style_request=False, region="us-east-1",
                    client_options={"allow_http": True}, skip_signature=True)

    async def fetch() -> int:
        got = await asyncio.gather(*(obstore.get_range_async(store, "eight.pt", start=o, end=o + n) for o, n in spans))
        return sum(len(g) for g in got)

    started = time.perf_counter()
    assert asyncio.run(fetch()) == READERS * TENSOR
    return READERS * TENSOR / (time.perf_counter() - started) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--limit-rate", help="nginx's limit_rate: each answer capped (40m: 40 MB/s)")
    parser.add_argument("--against", metavar="DIR", help="another source tree (e.g. main's), its mounts alternated")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ckptfs-readers-", dir="/var/tmp"))
    os.chmod(base, 0o755)
    server = Nginx(base, limit_rate=args.limit_rate)
    os.environ.update({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_REGION": "us-east-1"})
    variants = [("default FUSE loop", False, None), ("--multithreaded", True, None)]
    if args.against:
        variants += [(f"{args.against}: default", False, args.against),
                     (f"{args.against}: --multithreaded", True, args.against)]
    figures: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    figures["obstore"] = []
    mnt = str(base / "mnt")
    os.mkdir(mnt)
    try:
        (server.root / "bkt").mkdir()
        spans = make_checkpoint(server.root / "bkt" / "eight.pt")
        url = "s3://bkt/eight.pt"
        for _ in range(args.runs):
            for name, threaded, root in variants:
                mount(url, server.url, mnt, threaded, root)
                try:
                    figures[name].append(readers_through(mnt))
                finally:
                    subprocess.run(["fusermount3", "-u", mnt], check=True)
            figures["obstore"].append(obstore_readers(server.url, spans))
    finally:
        stop(server.process)
        shutil.rmtree(base, ignore_errors=True)
    cap = f", each connection capped at {args.limit_rate}" if args.limit_rate else ""
    print(f"{READERS} processes each dd bs=1M of a different {TENSOR // MiB} MiB tensor through one mount{cap} "
          f"(MB/s aggregate, median of {args.runs}; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    best = statistics.median(figures["obstore"])
    for name, values in figures.items():
        med = statistics.median(values)
        print(f"  {name:40s} {med:6.0f}  ({med / best:.2f}x obstore)  runs: {' '.join(f'{v:.0f}' for v in values)}")


if __name__ == "__main__":
    main()
