"""Repeat ``ckptfs ls`` of remote checkpoints with and without the metadata cache (requests, bytes, seconds).

    .venv/bin/python scripts/bench_lib/metadata_cache_remote.py [--tensors 20000] [--runs 5] [--dcp]

nginx on loopback (``remote.NginxS3``) serves a torch.save zip of ``--tensors`` small tensors named like a
mixture-of-experts model's, as ``http://`` and as path-style ``s3://`` (``--endpoint-url``, ``--anonymous``);
with ``--dcp``, a torch.distributed.checkpoint directory of as many tensors too, as a local directory and an
``s3://`` prefix. For each: ``ls --no-cache`` (a parse), then ``ls --cache-dir`` once (writes the entry) and
``--runs`` more (each reads it); the GETs of each run are counted in nginx's access log. Medians are printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import wait_for_cache_writers
from remote import BUCKET, NginxS3

CLI = [sys.executable, "-m", "ckptfs.cli"]


def save_zip(path: Path, count: int) -> None:
    import torch

    dtypes = (torch.float32, torch.bfloat16, torch.float16, torch.int8)
    gen = torch.Generator().manual_seed(count)
    state = {f"model.layers.{i // 48}.mlp.experts.{i // 3 % 16}.w{i % 3 + 1}.weight":
             torch.randint(-100, 100, (2, 3), generator=gen).to(dtypes[i % 4]) for i in range(count)}
    torch.save(state, path)


def save_dcp(path: Path, count: int) -> None:
    import torch
    import torch.distributed.checkpoint as dcp

    gen = torch.Generator().manual_seed(count)
    state = {f"model.layers.{i // 48}.mlp.experts.{i // 3 % 16}.w{i % 3 + 1}.weight":
             torch.randn(2, 3, generator=gen) for i in range(count)}
    dcp.save(state, checkpoint_id=str(path), no_dist=True)


def measure(server: NginxS3, argv: list[str]) -> tuple[float, int, int, str]:
    """Seconds, GETs, bytes sent and stdout of one command."""
    mark = server.mark()
    start = time.perf_counter()
    done = subprocess.run([*CLI, *argv], capture_output=True, text=True, check=True)
    seconds = time.perf_counter() - start
    time.sleep(0.2)  # nginx logs a request after answering it
    gets = server.since(mark)
    return seconds, len(gets), sum(sent for _, sent in gets), done.stdout


def compare(server: NginxS3, name: str, target: list[str], cache: Path, runs: int) -> list[str]:
    parse = [measure(server, [*target, "--no-cache"]) for _ in range(runs)]
    first = measure(server, [*target, "--cache-dir", str(cache)])
    wait_for_cache_writers(cache)  # ls writes the entry from a process of its own once done
    cached = [measure(server, [*target, "--cache-dir", str(cache)]) for _ in range(runs)]
    assert all(run[3] == parse[0][3] for run in [*parse, first, *cached]), f"{name}: listings differ"
    rows = []
    for label, results in (("no cache (parse)", parse), ("first, writes the entry", [first]),
                           ("repeat, from the entry", cached)):
        seconds, gets, sent = (statistics.median(r[i] for r in results) for i in range(3))
        rows.append(f"| {name} | {label} | {seconds:.3f} s | {gets:.0f} | {sent:,.0f} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--dcp", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ckptfs-cache-bench-") as work:
        base = Path(work)
        server = NginxS3(base / "nginx")
        os.chmod(base, 0o755)
        try:
            save_zip(server.root / BUCKET / "many.pt", args.tensors)
            s3 = ["--endpoint-url", server.url, "--anonymous"]
            rows = [f"| checkpoint ({args.tensors} tensors) | ckptfs ls | seconds | GETs | bytes |",
                    "|---|---|---|---|---|"]
            rows += compare(server, "zip, http://", ["ls", f"{server.url}/{BUCKET}/many.pt"], base / "c1", args.runs)
            rows += compare(server, "zip, s3:// (nginx)", ["ls", f"s3://{BUCKET}/many.pt", *s3], base / "c2", args.runs)
            if args.dcp:
                save_dcp(server.root / BUCKET / "dcp", args.tensors)
                rows += compare(server, "DCP, local dir", ["ls", str(server.root / BUCKET / "dcp")], base / "c3",
                                args.runs)
                rows += compare(server, "DCP, s3:// prefix (nginx)", ["ls", f"s3://{BUCKET}/dcp/", *s3], base / "c4",
                                args.runs)
        finally:
            server.close()
    print("\n".join(rows))


if __name__ == "__main__":
    main()
