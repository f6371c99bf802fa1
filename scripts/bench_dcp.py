"""DCP read cost: ``.venv/bin/python scripts/bench_dcp.py WORKDIR`` (needs the test extra: torch, zstandard).

Writes a 64 MiB float32 tensor as 4 chunks of 16 MiB (split along dimension 0, ``rows``, and along dimension 1,
``cols``), plain and ZStandard-compressed, and times the first 4 KiB read, sequential 1 MiB reads and random
4 KiB reads through ``ckptfs.open``; zstd once more with ``max_inflated_bytes`` below the chunk size (the items
then go to spill files under the cache directory), and once more without a cache directory (streamed).
"""

from __future__ import annotations

import os
import random
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import torch  # noqa: E402
from dcp_writers import simulate_ranks  # noqa: E402
from torch.distributed.checkpoint._extension import ZStandard  # noqa: E402

import ckptfs  # noqa: E402


def main(work: str) -> None:
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    tensor = torch.randn(4096, 4096)
    if not os.path.exists(f"{work}/plain"):
        state, cuts = {"rows": tensor, "cols": tensor.clone()}, {"rows": (0, 4), "cols": (1, 4)}
        simulate_ranks(state, cuts, f"{work}/plain", world=4)
        simulate_ranks(state, cuts, f"{work}/zstd", world=4, _extensions=[ZStandard()])
    want = tensor.numpy().tobytes()
    small = ckptfs.Limits(max_inflated_bytes=8 << 20)
    cache = os.environ.get("XDG_CACHE_HOME")
    for layout, limits, spill in (("plain", ckptfs.Limits(), ""), ("zstd", ckptfs.Limits(), ""),
                                  ("zstd", small, " spill file"), ("zstd", small, " streamed")):
        if spill == " streamed":
            os.environ["XDG_CACHE_HOME"] = "/dev/null/none"  # no cache directory can be made there
        for name in ("rows", "cols"):
            with ckptfs.open(f"{work}/{layout}", limits=limits) as ck:
                record = ck.tensor((name,))
                start = time.perf_counter()
                ck.read(record, 0, 4096)
                first = time.perf_counter() - start
                start = time.perf_counter()
                parts = [ck.read(record, o, 1 << 20) for o in range(0, record.nbytes, 1 << 20)]
                sequential = record.nbytes / (time.perf_counter() - start) / 2**20
                assert b"".join(parts) == want
                offsets = [random.Random(n).randrange(record.nbytes - 4096) for n in range(20)]
                start = time.perf_counter()
                for offset in offsets:
                    assert ck.read(record, offset, 4096) == want[offset : offset + 4096]
                rand = (time.perf_counter() - start) / len(offsets)
            budget = limits.max_inflated_bytes >> 20
            print(f"{layout:5} max_inflated_bytes={budget:3} MiB{spill} {name}: first 4 KiB read "
                  f"{first * 1e3:.0f} ms, sequential {sequential:.0f} MiB/s, random 4 KiB read {rand * 1e3:.1f} ms",
                  flush=True)
    if cache is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = cache


if __name__ == "__main__":
    main(sys.argv[1])
