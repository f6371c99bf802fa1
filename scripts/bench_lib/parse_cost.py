"""Parse cost: ``.venv/bin/python scripts/bench_lib/parse_cost.py [--workdir DIR] [--profile NAME]``.

Writes with torch (once; reused from ``--workdir``) a torch.save zip of 200,000 and one of 20,000 small
tensors named like a mixture-of-experts model's (``model.layers.L.mlp.experts.E.wK.weight``, fp32, bf16,
fp16 and int8 in turn), and a torch.distributed.checkpoint directory of 2,000 tensors cut in 4 chunks
each (4 simulated ranks). For each it times, in a fresh process per run (no torch imported there), the CPU
time of ``ckptfs.open`` until the tensors are collected (the cyclic GC paused, as ``ckptfs mount`` and the CLI
do), and of the standard library's C unpickler going through the same pickle with placeholders for every
class and persistent id (``pickle_floor.py``: the floor of a Python reader). CPU time, so that other work on
the machine stretches the figures less. ``--profile NAME`` runs cProfile on one ``ckptfs.open`` of that case
instead; ``--env PYTHONPATH=DIR`` times a copy of ckptfs in ``DIR`` (a compiled one, say).
Needs the test extra (torch) only to write the checkpoints.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CASES = {"zip200k": 200_000, "zip20k": 20_000, "dcp2k": 2_000}
DCP_CHUNKS = 4
FORMAT_VERSION = 1


def moe_names(count: int, experts: int = 64) -> list[str]:
    names = []
    layer = 0
    while len(names) < count:
        for expert in range(experts):
            for k in (1, 2, 3):
                names.append(f"model.layers.{layer}.mlp.experts.{expert}.w{k}.weight")
        layer += 1
    return names[:count]


def write_zip(path: Path, count: int) -> None:
    import torch

    dtypes = (torch.float32, torch.bfloat16, torch.float16, torch.int8)
    state = {}
    for n, name in enumerate(moe_names(count)):
        shape = (4, 2 + n % 3)
        state[name] = torch.full(shape, n % 100, dtype=dtypes[n % 4])
    torch.save(state, path)


def write_dcp(path: Path, count: int) -> None:
    import torch

    sys.path.insert(0, str(ROOT / "tests"))
    from dcp_writers import simulate_ranks

    state = {name: torch.full((8, 4), n % 100, dtype=torch.float32) for n, name in enumerate(moe_names(count))}
    simulate_ranks(state, {name: (0, DCP_CHUNKS) for name in state}, path, world=DCP_CHUNKS)


def ensure(workdir: Path) -> dict[str, Path]:
    paths = {"zip200k": workdir / "moe200k.pt", "zip20k": workdir / "moe20k.pt", "dcp2k": workdir / "dcp2k"}
    stamp = workdir / "parse_cost.json"
    want = {"cases": CASES, "version": FORMAT_VERSION}
    if stamp.exists() and json.loads(stamp.read_text()) == want and all(p.exists() for p in paths.values()):
        return paths
    for name, path in paths.items():
        start = time.process_time()
        (write_dcp if name.startswith("dcp") else write_zip)(path, CASES[name])
        print(f"wrote {path} in {time.process_time() - start:.1f} s", file=sys.stderr, flush=True)
    stamp.write_text(json.dumps(want))
    return paths


def measure_once(side: str, path: str) -> float:
    """Runs in a fresh child: seconds for one open (ckptfs) or one C unpickling (floor)."""
    if side == "ckptfs":
        import ckptfs
        from ckptfs.gc_pause import gc_paused

        start = time.process_time()
        with gc_paused(), ckptfs.open(path) as ck:  # as ``ckptfs mount`` and the CLI open
            count = len(ck)
        elapsed = time.process_time() - start
    else:
        sys.path.insert(0, str(HERE))
        import pickle_floor

        start = time.process_time()
        if os.path.isdir(path):
            with open(os.path.join(path, ".metadata"), "rb") as f:
                count = len(_DataclassFloor(f).load().__dict__["state_dict_metadata"])
        else:
            count = len(pickle_floor.root_of(path))
        elapsed = time.process_time() - start
    assert count > 0
    return elapsed


class _Inert:
    """Every class of a DCP ``.metadata``: NEWOBJ needs a real type, BUILD fills its ``__dict__``."""

    def __init__(self, *args: object) -> None:
        self.args = args

    def __setstate__(self, state: object) -> None:
        if isinstance(state, dict):
            self.__dict__.update(state)
        else:
            self.state = state


class _DataclassFloor(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> object:
        return _Inert


def child(side: str, path: str, env: dict[str, str]) -> float:
    out = subprocess.run([sys.executable, __file__, "--child", side, path], check=True, capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    return float(out.stdout)


def profile(path: str) -> None:
    import cProfile
    import pstats

    import ckptfs

    with cProfile.Profile() as prof, ckptfs.open(path) as ck:
        len(ck)
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "ckptfs-parse-cost"))
    p.add_argument("--runs", type=int, default=3, help="runs per figure; the median is shown (default 3)")
    p.add_argument("--cases", default=",".join(CASES), help=f"subset of {','.join(CASES)}")
    p.add_argument("--profile", choices=CASES, help="cProfile one ckptfs.open of this case instead")
    p.add_argument("--env", action="append", default=[], metavar="K=V", help="environment of the ckptfs runs")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(measure_once(*a.child))
        return
    workdir = Path(a.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    paths = ensure(workdir)
    if a.profile:
        profile(str(paths[a.profile]))
        return
    env = dict(item.split("=", 1) for item in a.env)
    print(f"{'case':8} {'tensors':>8} {'ckptfs s':>9} {'µs/tensor':>10} {'C floor s':>10} {'µs/tensor':>10} "
          f"{'ratio':>6}")
    for name in a.cases.split(","):
        ours = statistics.median(child("ckptfs", str(paths[name]), env) for _ in range(a.runs))
        floor = statistics.median(child("floor", str(paths[name]), {}) for _ in range(a.runs))
        n = CASES[name]
        print(f"{name:8} {n:8} {ours:9.3f} {ours / n * 1e6:10.1f} {floor:10.3f} {floor / n * 1e6:10.1f} "
              f"{ours / floor:6.1f}", flush=True)


if __name__ == "__main__":
    main()
