"""Requests, bytes and time to open a DCP directory from a URL prefix and read its tensors, counted in nginx's
access log (nginx-light on 127.0.0.1, started here; the directory written with torch's DCP writer).

    .venv/bin/python scripts/bench_lib/remote_prefix.py [--ranks 8] [--tensors 16] [--mib 4]

Prints the directory's size, then for opening, one tensor read alone, and every tensor after it: requests,
MiB fetched and milliseconds.
"""
import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

import torch  # noqa: E402
from dcp_writers import simulate_ranks  # noqa: E402
from remote_servers import nginx_server  # noqa: E402

import ckptfs  # noqa: E402

MiB = 1 << 20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--tensors", type=int, default=16)
    parser.add_argument("--mib", type=int, default=4, help="MiB of each float32 tensor")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ckptfs-prefix-bench-"))
    server_run = nginx_server(base)
    server = next(server_run)
    try:
        side = int((args.mib * MiB // 4) ** 0.5)
        torch.manual_seed(0)
        state = {"model": {f"layer{i}": torch.randn(side, side) for i in range(args.tensors)}, "step": 1}
        simulate_ranks(state, {f"model.layer{i}": (0, args.ranks) for i in range(args.tensors)},
                       server.root / "step1", world=args.ranks)
        files = list((server.root / "step1").iterdir())
        print(f"{args.ranks} ranks, {args.tensors} tensors of {args.mib} MiB in {args.ranks} chunks each: "
              f"{sum(f.stat().st_size for f in files) / MiB:.1f} MiB in {len(files)} files")

        def measured(what: str, action) -> None:  # type: ignore[no-untyped-def]
            mark, start = server.mark(), time.perf_counter()
            action()
            took = time.perf_counter() - start
            requests = server.since(mark)
            print(f"{what}: {len(requests)} requests, {sum(r.sent for r in requests) / MiB:.2f} MiB, "
                  f"{took * 1000:.0f} ms")

        opened: list[ckptfs.Checkpoint] = []
        measured("open", lambda: opened.append(ckptfs.open(f"{server.url}/step1/")))
        ck = opened[0]
        measured("one tensor alone", lambda: ck.read(ck.tensor(("model", "layer3"))))
        measured("every tensor after", lambda: [ck.read(t) for t in ck])
        ck.close()
    finally:
        for _ in server_run:
            pass
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
