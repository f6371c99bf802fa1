"""A remote checkpoint through a mount against one bare ranged GET of the same object (run as root).

    python scripts/bench_lib/remote_mount.py http://127.0.0.1:18080/bkt/bench.pt http://127.0.0.1:18080/bkt/bench.pt
    python scripts/bench_lib/remote_mount.py s3://bkt/bench.pt http://127.0.0.1:18080/bkt/bench.pt \\
        --endpoint-url http://127.0.0.1:18080 --anonymous          # nginx as a path-style S3 stand-in

The first argument is mounted (further arguments go to ``ckptfs mount``); the second is the same object over
plain HTTP for the bare GETs. The checkpoint's tensor file ``big`` (float32) is read: ``cat`` after a fresh
mount, ``np.memmap(...).sum()``, and 200 random 4 KiB ``pread``s against as many bare keep-alive GETs.
"""
import http.client
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse

import numpy as np

CLI = [sys.executable, "-m", "ckptfs.cli"]


def main() -> None:
    url, bare_url, extra = sys.argv[1], sys.argv[2], sys.argv[3:]
    bare = urllib.parse.urlsplit(bare_url)
    mnt = tempfile.mkdtemp(prefix="ckptfs-remote-bench-")

    def mount() -> float:
        subprocess.run([*CLI, "umount", mnt], capture_output=True)
        started = time.perf_counter()
        subprocess.run([*CLI, "mount", url, mnt, *extra], check=True)
        return time.perf_counter() - started

    try:
        print(f"mount: {mount():.2f} s")
        big = os.path.join(mnt, "big")
        size = os.path.getsize(big)
        for name in ("cat", "memmap.sum"):
            mount()
            started = time.perf_counter()
            if name == "cat":
                subprocess.run(["cat", big], stdout=subprocess.DEVNULL, check=True)
            else:
                float(np.memmap(big, np.float32, "r").sum(dtype=np.float64))
            print(f"{name} of {size >> 20} MiB: {size / 2**20 / (time.perf_counter() - started):.0f} MiB/s")
        conn = http.client.HTTPConnection(bare.hostname, bare.port or 80)
        started = time.perf_counter()
        conn.request("GET", bare.path, headers={"Range": f"bytes=0-{size - 1}"})
        conn.getresponse().read()
        print(f"bare: one GET of {size >> 20} MiB: {size / 2**20 / (time.perf_counter() - started):.0f} MiB/s")
        mount()
        rng, through, direct = random.Random(3), [], []
        fd = os.open(big, os.O_RDONLY)
        for _ in range(200):
            offset = rng.randrange(0, size - 4096) // 4096 * 4096
            started = time.perf_counter()
            os.pread(fd, 4096, offset)
            through.append(time.perf_counter() - started)
            started = time.perf_counter()
            conn.request("GET", bare.path, headers={"Range": f"bytes={offset}-{offset + 4095}"})
            conn.getresponse().read()
            direct.append(time.perf_counter() - started)
        os.close(fd)
        print(f"4 KiB random read: median {statistics.median(through) * 1e6:.0f} us through the mount, "
              f"{statistics.median(direct) * 1e6:.0f} us a bare GET")
    finally:
        subprocess.run([*CLI, "umount", mnt], capture_output=True)
        os.rmdir(mnt)


if __name__ == "__main__":
    main()
