"""One reader of the load test: random tensors of a mount at random offsets and sizes, checked byte for byte.

Run as ``python load_reader.py MOUNT EXPECTED INDEX SEED READS`` (a process) or through ``read_randomly``
(a thread). It reads every tensor (a shuffled pass over all of them, repeated) and prints/returns
``{"reads", "bytes", "wrong", "errors", "tensors"}`` (tensors: how many distinct ones it read).
"""

from __future__ import annotations

import json
import mmap
import os
import random
import sys
from pathlib import Path

MAX_READ = 256 << 10


def read_randomly(mount: Path, expected: bytes | mmap.mmap, index: list[dict], seed: int, reads: int) -> dict:
    rng = random.Random(seed)
    counts = {"reads": 0, "bytes": 0, "wrong": 0, "errors": 0, "error_samples": []}
    seen: set[str] = set()
    order: list[dict] = []
    while counts["reads"] < reads:
        if not order:
            order = index[:]
            rng.shuffle(order)
        entry = order.pop()
        seen.add(entry["file"])
        nbytes = entry["nbytes"]
        offset = rng.randrange(nbytes)
        size = min(nbytes - offset, int(2 ** rng.uniform(0, 18)))
        try:
            fd = os.open(mount / entry["file"], os.O_RDONLY)
            try:
                data = os.pread(fd, size, offset)
            finally:
                os.close(fd)
        except OSError as exc:
            counts["errors"] += 1
            counts["error_samples"] = (counts["error_samples"] + [f"{entry['file']}: {exc}"])[:5]
        else:
            start = entry["start"] + offset
            counts["wrong"] += data != expected[start : start + size]
            counts["bytes"] += len(data)
        counts["reads"] += 1
    counts["tensors"] = len(seen)
    return counts


def main() -> None:
    mount, expected_path, index_path, seed, reads = sys.argv[1:]
    index = json.loads(Path(index_path).read_text())
    with open(expected_path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as expected:
        print(json.dumps(read_randomly(Path(mount), expected, index, int(seed), int(reads))))


if __name__ == "__main__":
    main()
