"""ShardedTensors of a torch.save mounted for real: the whole tensor gathered from a one-rank save's shards is read
by ``cat``, ``dd``, numpy (its file and ``.npy``) and safetensors (``model.safetensors``) as torch's ``gather``
gives it; a rank's file of a two-rank job shows why it has none."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from dcp_writers import raw_bytes
from safetensors.torch import load_file
from sharded_tensor_writer import write_ranks

from mount.helpers import Mounter, tensor_file

pytestmark = pytest.mark.mount


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    base = tmp_path_factory.mktemp("sharded_mount")
    write_ranks(base / "one", 1)
    write_ranks(base / "two", 2)
    return base, torch.load(base / "one" / "gathered.pt")


def test_the_whole_tensors_read_by_real_programs(written: tuple[Path, dict[str, torch.Tensor]],
                                                 mounter: Mounter) -> None:
    base, gathered = written
    mnt = mounter(base / "one" / "rank0.pt")
    for name in ("rows", "cols", "grid", "uneven"):
        whole = tensor_file(mnt, (name, "__gathered__"))
        cat = subprocess.run(["cat", str(whole)], capture_output=True, check=True)
        assert cat.stdout == raw_bytes(gathered[name]), name
    grid = tensor_file(mnt, ("grid", "__gathered__"))
    assert np.array_equal(np.fromfile(grid, dtype="<i8").reshape(4, 6), gathered["grid"].numpy())
    dd = subprocess.run(["dd", f"if={grid}", "bs=8", "skip=5", "count=9", "status=none"], capture_output=True,
                        check=True)
    assert dd.stdout == raw_bytes(gathered["grid"])[40:112]
    assert np.array_equal(np.load(str(grid) + ".npy"), gathered["grid"].numpy())
    views = load_file(mnt / "model.safetensors")
    for name, tensor in gathered.items():
        assert torch.equal(views[f"{name}.__gathered__"], tensor), name
    sidecar = json.loads(Path(str(grid) + ".json").read_text())
    assert sidecar["shape"] == [4, 6] and [c["tensor"] for c in sidecar["chunks"]] == [
        ["grid", "__state__", 0, n, "tensor"] for n in range(4)]


def test_a_rank_s_file_says_why(written: tuple[Path, dict[str, torch.Tensor]], mounter: Mounter) -> None:
    base, _ = written
    mnt = mounter(base / "two" / "rank1.pt")
    assert (mnt / "rows" / "__not_gathered__").read_text().strip() == (
        "the local shards do not make the whole tensor: they hold 12 of its 28 elements (the rest were on other "
        "ranks)")
    assert not (mnt / "rows" / "__gathered__").exists()
