"""The floor of a remote mount's daemon CPU per GiB (issue 25's <= 0.35 s row): ``remote_floor.c`` (16 threads,
8 MiB ranged GETs recv'd into a memfd, then spliced as libfuse sends replies: to /dev/null, and into a memfd,
which copies as /dev/fuse does) and obstore's own process CPU (user + system, all threads) for its 16 parallel
8 MiB parts, alternating, on nginx (``tests/remote_servers.py``) serving a 1 GiB file on loopback. Medians.

    PYTHONPATH=PEERS .venv/bin/python scripts/bench_lib/remote_floor.py [--runs 3]

(PEERS: a folder holding obstore.)
"""
from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from remote_servers import Nginx, stop  # noqa: E402

GiB = 1 << 30
PART = 8 << 20
THREADS = 16
FLOORS = ("GETs recv'd into a memfd", "then spliced to /dev/null", "then spliced into a memfd (copied)")


def obstore_cpu(url: str) -> float:
    """obstore's process CPU seconds fetching the 1 GiB in 16 parallel parts of 8 MiB (its runtime's threads)."""
    import obstore
    from obstore.store import HTTPStore

    store = HTTPStore.from_url(url, client_options={"allow_http": True})

    async def fetch() -> int:
        got = await asyncio.gather(*(obstore.get_range_async(store, "big.bin", start=at, end=at + PART)
                                     for at in range(0, GiB, PART)))
        return sum(len(g) for g in got)

    before = resource.getrusage(resource.RUSAGE_SELF)
    assert asyncio.run(fetch()) == GiB
    after = resource.getrusage(resource.RUSAGE_SELF)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--obstore-child", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.obstore_child:
        print(obstore_cpu(args.obstore_child))
        return
    base = Path(tempfile.mkdtemp(prefix="ckptfs-floor-", dir="/var/tmp"))
    os.chmod(base, 0o755)
    binary = str(base / "remote_floor")
    subprocess.run(["gcc", "-O2", "-pthread", str(Path(__file__).with_name("remote_floor.c")), "-o", binary],
                   check=True)
    server = Nginx(base)
    figures: dict[str, list[float]] = {name: [] for name in (*FLOORS, "obstore, 16 parallel 8 MiB parts")}
    try:
        with open(server.root / "big.bin", "wb") as f:
            f.write(os.urandom(1 << 20) * 1024)
        host, port = server.url.split("//")[1].split(":")
        for _ in range(args.runs):
            for splice, name in enumerate(FLOORS):
                out = subprocess.run([binary, host, port, "/big.bin", "0", str(GiB), str(THREADS), str(PART),
                                      str(splice)], capture_output=True, text=True, check=True).stdout
                figures[name].append(float(out.split("total ")[1].split()[0]))
            out = subprocess.run([sys.executable, __file__, "--obstore-child", server.url], capture_output=True,
                                 text=True, check=True).stdout
            figures["obstore, 16 parallel 8 MiB parts"].append(float(out))
    finally:
        stop(server.process)
        shutil.rmtree(base, ignore_errors=True)
    print(f"CPU (user + system) per GiB, median of {args.runs} (load {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores)")
    for name, values in figures.items():
        print(f"  {name:40s} {statistics.median(values):.3f} s  runs: {' '.join(f'{v:.3f}' for v in values)}")


if __name__ == "__main__":
    main()
