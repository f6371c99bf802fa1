"""``ckptfs mount --nest`` (and ``-o nest``) through a real mount: find, ls, cat and numpy see a dict's dotted keys as
directories; ``ckptfs ls --nest`` names the same files; sidecars and the index keep the exact keys."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from corpus import save_zip

from mount.helpers import Mounter, run_cli

pytestmark = pytest.mark.mount


def _state_dict() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    sd = {f"model.layers.{layer}.mlp.experts.{e}.w{k}.weight": torch.randn(4, 2, generator=gen)
          for layer in range(2) for e in range(3) for k in (1, 2)}
    sd["model.norm.weight"] = torch.randn(4, generator=gen).to(torch.bfloat16)
    sd["lm_head.weight"] = torch.randint(-9, 9, (3,), generator=gen, dtype=torch.int8)
    sd["model.tied.weight"] = sd["model.norm.weight"]
    return sd


@pytest.fixture
def source(tmp_path: Path) -> Path:
    return save_zip(_state_dict(), tmp_path / "moe.pt")


def _files(mnt: Path) -> list[str]:
    out = subprocess.run(["find", str(mnt), "-path", f"{mnt}/.ckptfs", "-prune", "-o", "-type", "f", "-print"],
                         capture_output=True, text=True, check=True).stdout
    return sorted(os.path.relpath(line, mnt) for line in out.splitlines())


@pytest.mark.parametrize("flag", [("--nest",), ("-o", "nest")])
def test_nested_tree_reads_as_torch_wrote_it(source: Path, mounter: Mounter, flag: tuple[str, ...]) -> None:
    sd = _state_dict()
    mnt = mounter(source, *flag)
    tensors = [f for f in _files(mnt) if not f.endswith((".json", ".npy", ".safetensors"))]
    assert tensors == sorted(["lm_head.weight", "model/norm.weight"] + [
        f"model/layers/{layer}/mlp/experts/{e}/w{k}.weight" for layer in range(2) for e in range(3) for k in (1, 2)])
    listed = subprocess.run(["ls", str(mnt / "model/layers/1/mlp/experts/2")], capture_output=True, text=True,
                            check=True).stdout.split()
    assert listed == ["w1.weight", "w1.weight.json", "w1.weight.npy", "w2.weight", "w2.weight.json", "w2.weight.npy"]
    for file in tensors:
        key = file.replace("/", ".")
        data = subprocess.run(["cat", str(mnt / file)], capture_output=True, check=True).stdout
        assert data == sd[key].contiguous().view(torch.uint8).numpy().tobytes(), file
        assert json.loads((mnt / f"{file}.json").read_text())["path"] == [key]
    assert np.array_equal(np.load(mnt / "model/layers/0/mlp/experts/1/w2.weight.npy"),
                          sd["model.layers.0.mlp.experts.1.w2.weight"].numpy())
    assert os.readlink(mnt / "model/tied.weight") == "norm.weight"
    index = json.loads((mnt / ".ckptfs/index.json").read_bytes())
    assert {t["file"]: t["path"] for t in index["tensors"]} == {f: [f.replace("/", ".")] for f in tensors}
    out = run_cli("ls", "--nest", source)
    assert out.returncode == 0, out.stderr
    assert sorted(line.split()[0] for line in out.stdout.splitlines() if " -> " not in line) == tensors
    assert [line.split("  ")[0] for line in out.stdout.splitlines() if " -> " in line] == [
        "model/tied.weight -> model/norm.weight"]


def test_without_nest_the_same_file_is_flat(source: Path, mounter: Mounter) -> None:
    mnt = mounter(source)
    assert "model.layers.0.mlp.experts.0.w1.weight" in os.listdir(mnt)
    out = run_cli("ls", source)
    assert out.stdout.splitlines()[0].split()[0] == "model.layers.0.mlp.experts.0.w1.weight"
