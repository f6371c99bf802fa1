"""Lookup cost: ``.venv/bin/python scripts/bench_lib/lookup_cost.py [--workdir DIR] [--runs N] [--tree DIR ...]``.

What a worker's first read of one file through the fsspec file system costs: a ``ckpt`` file system of a
20,000-tensor state dict (written with torch once, reused from ``--workdir``) is pickled, then, in a fresh process
per run and per operation, unpickled (as a Dask worker gets it) and asked once for ``cat_file`` of a tensor,
``info`` of a sidecar, ``open``/``read`` of a ``.npy`` view. Per operation: the nodes of the tree made
(``Node.__init__`` calls), the directories' names made (``child_names`` calls) and the seconds. ``--tree DIR``
(repeatable) runs the copy of ckptfs in ``DIR`` instead of this one, the trees' runs alternated, so that two
versions are compared side by side. Needs torch only to write the checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TENSORS = 20_000
OPERATIONS = ("cat_file", "info_sidecar", "open_npy")
PATH = "model.layers.3.mlp.w5.weight"

_MEASURE = """
import json, pickle, sys, time
import ckptfs.fs.names, ckptfs.fs.nodes
from ckptfs.fsspec import CheckpointFileSystem

counts = {"nodes": 0, "names": 0}
made, named = ckptfs.fs.nodes.Node.__init__, ckptfs.fs.names.child_names

def counted_node(self, *args):
    counts["nodes"] += 1
    made(self, *args)

def counted_names(keys):
    counts["names"] += 1
    return named(keys)

ckptfs.fs.nodes.Node.__init__ = counted_node
for module in list(sys.modules.values()):
    if getattr(module, "__name__", "").startswith("ckptfs.fs") and getattr(module, "child_names", None) is named:
        module.child_names = counted_names
operation, path = sys.argv[1], sys.argv[2]
with open(sys.argv[3], "rb") as pickled:
    fs = pickle.load(pickled)
start = time.perf_counter()
if operation == "cat_file":
    fs.cat_file(path)
elif operation == "info_sidecar":
    fs.info(path + ".json")
else:
    with fs.open(path + ".npy") as npy:
        npy.read()
print(json.dumps({"s": time.perf_counter() - start, **counts}))
"""


def _checkpoint(workdir: Path) -> Path:
    pickled = workdir / f"lookup-{TENSORS}.fs.pickle"
    if not pickled.exists():
        import pickle

        import torch

        generator = torch.Generator().manual_seed(23)
        state = {f"model.layers.{i // 16}.mlp.w{i % 16}.weight": torch.randn(16, 16, generator=generator)
                 for i in range(TENSORS)}
        path = workdir / f"lookup-{TENSORS}.pt"
        torch.save(state, path)
        sys.path.insert(0, str(REPO))
        from ckptfs.fsspec import CheckpointFileSystem

        pickled.write_bytes(pickle.dumps(CheckpointFileSystem(fo=str(path))))
    return pickled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/ckptfs-lookup-cost"))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tree", action="append", type=Path, help="a copy of ckptfs to run (default: this one)")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    pickled = _checkpoint(args.workdir)
    trees = args.tree or [REPO]
    found: dict[tuple[str, str], list[dict[str, float]]] = {}
    for _ in range(args.runs):
        for tree in trees:
            for operation in OPERATIONS:
                env = {**os.environ, "PYTHONPATH": str(tree)}
                out = subprocess.run([sys.executable, "-c", _MEASURE, operation, PATH, str(pickled)], env=env,
                                     cwd=args.workdir,  # not this tree: -c puts the working directory first
                                     check=True, capture_output=True, text=True).stdout
                found.setdefault((str(tree), operation), []).append(json.loads(out))
    print("| tree | operation | nodes made | names made | s (median) |\n|---|---|---|---|---|")
    for (tree, operation), runs in found.items():
        print(f"| {tree} | {operation} | {max(r['nodes'] for r in runs):.0f} | {max(r['names'] for r in runs):.0f} "
              f"| {statistics.median(r['s'] for r in runs):.3f} |")


if __name__ == "__main__":
    main()
