"""A torch.distributed.checkpoint directory mounted for real: sharded tensors read by ``cat``, ``dd`` and numpy
are the whole tensors torch saved; sidecars name the chunks."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from dcp_writers import raw_bytes, simulate_ranks

from mount.helpers import Mounter, run_cli, tensor_file

pytestmark = pytest.mark.mount


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """Three ranks; ``big`` (1.2 MB) is cut along dimension 1, so every run of a row comes from another file."""
    from torch.distributed.checkpoint._extension import ZStandard

    torch.manual_seed(0)
    state = {"model": {"big": torch.randn(600, 500), "rows": torch.arange(90, dtype=torch.int64).reshape(9, 10),
                       "layer.0": {"w": torch.ones(2, 2, dtype=torch.bfloat16)}},
             "meta": {"epoch": 3, "tags": ["a", "b"]}}
    base = tmp_path_factory.mktemp("dcp_mount")
    simulate_ranks(state, {"model.big": (1, 3), "model.rows": (0, 3)}, base / "plain", world=3)
    simulate_ranks(state, {"model.big": (1, 3), "model.rows": (0, 3)}, base / "zstd", world=3,
                   _extensions=[ZStandard()])
    return base, state


@pytest.mark.parametrize("layout", ["plain", "zstd"])
def test_sharded_tensors_read_by_real_programs(sharded: tuple[Path, dict], layout: str, mounter: Mounter) -> None:
    base, state = sharded
    mnt = mounter(base / layout)
    big = tensor_file(mnt, ("model", "big"))
    cat = subprocess.run(["cat", str(big)], capture_output=True, check=True)
    assert cat.stdout == raw_bytes(state["model"]["big"])
    assert np.array_equal(np.fromfile(big, dtype="<f4").reshape(600, 500), state["model"]["big"].numpy())
    dd = subprocess.run(["dd", f"if={big}", "bs=1000", "skip=333", "count=7", "status=none"], capture_output=True,
                        check=True)
    assert dd.stdout == raw_bytes(state["model"]["big"])[333_000:340_000]
    rows = tensor_file(mnt, ("model", "rows"))
    assert rows.read_bytes() == raw_bytes(state["model"]["rows"])
    assert tensor_file(mnt, ("model", "layer.0", "w")).read_bytes() == raw_bytes(state["model"]["layer.0"]["w"])
    assert (mnt / "meta" / "epoch").read_text().strip() == "3"


def test_sidecar_and_ls(sharded: tuple[Path, dict], mounter: Mounter) -> None:
    base, _ = sharded
    mnt = mounter(base / "plain")
    big = tensor_file(mnt, ("model", "big"))
    sidecar = json.loads(Path(str(big) + ".json").read_text())
    assert sidecar["shape"] == [600, 500] and sidecar["path"] == ["model", "big"]
    assert [(c["offsets"], c["sizes"], c["file"]) for c in sidecar["chunks"]] == [
        ([0, 0], [600, 167], "__0_0.distcp"), ([0, 167], [600, 167], "__1_0.distcp"),
        ([0, 334], [600, 166], "__2_0.distcp")]
    assert sidecar["source_ranges"] == [[c["file"], *c["range"]] for c in sidecar["chunks"]]
    listing = run_cli("ls", base / "plain")
    assert listing.returncode == 0 and listing.stdout.splitlines()[0].split()[:3] == ["model/big", "float32",
                                                                                      "600x500"]


def test_a_huggingface_storage_writer_directory(tmp_path: Path, mounter: Mounter) -> None:
    """safetensors shards and their index, as ``HuggingFaceStorageWriter`` writes them: each tensor a file whose
    bytes ``cat`` reads as torch saved them (served from the shard's own descriptor)."""
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter

    state = {"emb": torch.randn(64, 32).bfloat16(), "lin.weight": torch.randn(16, 8), "cnt": torch.tensor([3])}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, storage_writer=HuggingFaceStorageWriter(str(tmp_path / "hf"), fqn_to_index_mapping={
            "emb": 1, "lin.weight": 2, "cnt": 2}), no_dist=True)
    mnt = mounter(tmp_path / "hf")
    for fqn, tensor in state.items():
        cat = subprocess.run(["cat", str(tensor_file(mnt, (fqn,)))], capture_output=True, check=True)
        assert cat.stdout == raw_bytes(tensor)
