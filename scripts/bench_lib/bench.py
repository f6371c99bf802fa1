"""The command line of the benchmark (run it as ``scripts/bench``): ckptfs side by side with the limits it should approach.

Every figure is measured for ckptfs and for its limit in the same run, pair by pair
(each run measures every side back to back), and reported as the median over runs of
the per-run ratio, so drift of the machine cancels:

* raw     the same byte range of the .pt read directly (the physical limit; the source is warm)
* cpass   a minimal C pass-through on libfuse3 exposing that byte range (the kernel's FUSE limit)
* clist   a C file system listing the root ckptfs shows (mount and ``find -ls`` figures)
* floor   a Python process reading the pickle with the C unpickler (``pickle_floor.py``), plus clist
* ckptfs  the tensor file of ``ckptfs mount``
* ratar   the same record through ratarmount (``--ratarmount``)
* torch   ``torch.load(mmap=True, weights_only=True)`` + names and shapes (legacy: plain load)

See ``scripts/bench --help`` and docs/benchmarks.md. The modules, each importing only
those before it: common -> mounts, results, torch_client -> harness -> one module per section -> sections
(the registry) -> bench (this command line).
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

from common import BenchError, log
from harness import Bench
from sections import DEFAULT_NAMES, OPTIONAL_NAMES, SECTIONS


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="scripts/bench",
        description="Benchmark ckptfs side by side with its limits: the raw .pt, a C libfuse3 pass-through, "
                    "torch.load and (optionally) ratarmount. Prints a table; --json writes every figure.")
    p.add_argument("--json", metavar="PATH", help="write all figures, per-run values and ratios as JSON")
    p.add_argument("--runs", type=int, default=5, help="runs per figure; medians are reported (default 5)")
    p.add_argument("--quick", action="store_true", help="smoke sizes: 64 MiB tensor, 2,000 tensors")
    p.add_argument("--ratarmount", action="store_true", help="also measure ratarmount on the same files")
    p.add_argument("--workdir", metavar="DIR", help="where checkpoints and mounts go (default: a new /var/tmp dir)")
    p.add_argument("--keep", action="store_true", help="keep the work directory (a later --workdir run reuses it); "
                   "without it, a --workdir loses only what this run wrote")
    p.add_argument("--sections", default=",".join(DEFAULT_NAMES),
                   help=f"comma-separated subset of {','.join(DEFAULT_NAMES + OPTIONAL_NAMES)} (default: "
                        f"{','.join(DEFAULT_NAMES)})")
    p.add_argument("--views", action="store_true",
                   help="also measure the views (model.safetensors, .npy, /.zarr) and ckptfs diff/convert "
                        "(section 'views'; see scripts/bench_lib/views.py)")
    p.add_argument("--scale", action="store_true",
                   help="add the scale section: 200,000 MoE-named tensors (--quick: 20,000), torch side by side")
    p.add_argument("--scale-tensors", type=int, metavar="N", help="tensors in the scale section's checkpoint")
    p.add_argument("--big-mib", type=int, help="size of the big tensor in MiB (default 1024; --quick 64)")
    p.add_argument("--tensors", type=int, help="tensors in the many-tensor checkpoint (default 20000; --quick 2000)")
    p.add_argument("--preads", type=int, default=20000, help="random 4 KiB preads per run (default 20000)")
    p.add_argument("--cpass-mode", choices=("buf", "read"), default="buf",
                   help="C pass-through answers with read_buf (fd buffer, default) or pread")
    p.add_argument("--cpass-threads", choices=("single", "multi"), default="single",
                   help="C pass-through event loop (default single: streams fastest)")
    p.add_argument("--read-ahead-kb", type=int, default=1024, help="read_ahead_kb set on the C pass-through mount")
    p.add_argument("--alt-root", metavar="DIR",
                   help="A/B: also measure ckptfs from this source tree (DIR/ckptfs) as side 'alt', pair by pair")
    p.add_argument("--alt-env", action="append", default=[], metavar="K=V",
                   help="A/B: environment for the 'alt' side only (with or without --alt-root)")
    p.add_argument("--ckptfs-read-ahead-kb", type=int, metavar="KB",
                   help="experiment: set this read_ahead_kb on ckptfs mounts after they start")
    p.add_argument("--ckptfs-root", metavar="DIR", help="run ckptfs from this source tree (PYTHONPATH) instead")
    p.add_argument("--mount-mode", choices=("daemon", "foreground"), default="daemon",
                   help="time 'ckptfs mount' until it returns (daemon, default) or run it with -f and poll "
                        "until the mount answers (foreground)")
    p.add_argument("--ckptfs-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for ckptfs mount (repeatable)")
    p.add_argument("--ckptfs-env", action="append", default=[], metavar="K=V",
                   help="environment variable for the ckptfs daemon (repeatable)")
    p.add_argument("--remote", action="store_true",
                   help="add the remote section: the checkpoints as s3:// URLs over nginx and radosgw on loopback, "
                        "against S3 clients (remote.py; --sections remote for this alone)")
    p.add_argument("--allow-no-ckptfs", action="store_true",
                   help="if ckptfs mount is unavailable, still measure the limits (raw, C, torch, ratarmount)")
    a = p.parse_args(argv)
    a.sections = [s.strip() for s in a.sections.split(",") if s.strip()]
    a.sections += [name for name in OPTIONAL_NAMES if getattr(a, name, False) and name not in a.sections]
    bad = set(a.sections) - set(DEFAULT_NAMES) - set(OPTIONAL_NAMES)
    if bad:
        p.error(f"unknown sections: {', '.join(sorted(bad))}")
    if a.runs < 1:
        p.error("--runs must be at least 1")
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def on_signal(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored (nohup, &)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    try:
        return Bench(args, SECTIONS).main()
    except BenchError as exc:
        log(f"error: {exc}")
        return 1
    except KeyboardInterrupt:
        log("interrupted; mounts removed")
        return 130


if __name__ == "__main__":
    sys.exit(main())
