"""Random 4 KiB ``pread``s through mounts of several ckptfs trees at once, read by read in turn, and a bare ranged
GET of the same bytes after each: the mounts and the GET share the machine's load at every read. A 512 MiB tensor
on nginx (``tests/remote_servers.py``), fresh ``--no-cache`` mounts, medians.

    .venv/bin/python scripts/bench_lib/remote_random.py TREE [TREE ...] [--reads 2000] [--seed 1]

A TREE ending in ``+mt`` is mounted ``--multithreaded``.
"""
from __future__ import annotations

import argparse
import http.client
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from remote_servers import Nginx, stop

SIZE = 512 << 20


def storage_offset(path: Path) -> int:
    """Where the checkpoint's one storage's bytes begin in the zip."""
    with zipfile.ZipFile(path) as archive:
        (info,) = [i for i in archive.infolist() if "/data/" in i.filename]
    with open(path, "rb") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = (int.from_bytes(f.read(2), "little") for _ in range(2))
    return info.header_offset + 30 + name_len + extra_len


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("trees", nargs="+")
    parser.add_argument("--reads", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    import torch

    base = Path(tempfile.mkdtemp(prefix="ckptfs-random-", dir="/var/tmp"))
    os.chmod(base, 0o755)
    server = Nginx(base)
    mounts: list[str] = []
    fds: list[int] = []
    try:
        (server.root / "bkt").mkdir()
        path = server.root / "bkt" / "m.pt"
        torch.save({"big": torch.zeros(SIZE // 4)}, path)
        offset = storage_offset(path)
        env = {**os.environ, "AWS_ACCESS_KEY_ID": "b", "AWS_SECRET_ACCESS_KEY": "b", "AWS_REGION": "us-east-1"}
        for index, tree in enumerate(args.trees):
            mnt = str(base / f"mnt{index}")
            os.mkdir(mnt)
            subprocess.run([sys.executable, "-m", "ckptfs.cli", "mount", "s3://bkt/m.pt", mnt, "--endpoint-url",
                            server.url, "--anonymous", "--no-cache", *(["--multithreaded"] if tree.endswith("+mt")
                                                                      else [])],
                           check=True, env={**env, "PYTHONPATH": tree.removesuffix("+mt"),
                                            "XDG_CACHE_HOME": tempfile.mkdtemp()})
            mounts.append(mnt)
            fds.append(os.open(f"{mnt}/big", os.O_RDONLY))
            os.pread(fds[-1], 4096, 0)  # the storage's framing is checked on its first read: not what is timed
        host, port = server.url.split("//")[1].split(":")
        bare = http.client.HTTPConnection(host, int(port))
        rng = random.Random(args.seed)
        through: list[list[float]] = [[] for _ in args.trees]
        direct = []
        for _ in range(args.reads):
            at = rng.randrange(4096, SIZE - 4096) // 4096 * 4096
            for fd, times in zip(fds, through):
                started = time.perf_counter()
                os.pread(fd, 4096, at)
                times.append(time.perf_counter() - started)
            started = time.perf_counter()
            bare.request("GET", "/bkt/m.pt", headers={"Range": f"bytes={offset + at}-{offset + at + 4095}"})
            response = bare.getresponse()
            if len(response.read()) != 4096 or response.status != 206:
                raise RuntimeError(f"a bare ranged GET answered {response.status}")
            direct.append(time.perf_counter() - started)
    finally:
        for fd in fds:
            os.close(fd)
        for mnt in mounts:
            subprocess.run(["fusermount3", "-u", mnt], check=False)
        stop(server.process)
        shutil.rmtree(base, ignore_errors=True)
    bare_us = statistics.median(direct) * 1e6
    print(f"random 4 KiB pread, median of {args.reads} (load {os.getloadavg()[0]:.1f}); bare GET {bare_us:.0f} us")
    for tree, times in zip(args.trees, through):
        median = statistics.median(times) * 1e6
        print(f"  {tree}: {median:.0f} us, {median / bare_us:.2f}x")


if __name__ == "__main__":
    main()
