"""A torch.export ``.pt2`` archive through a real mount: weights read with cat and numpy, tied weights as links."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
from corpus import torch_bytes
from pt2_writer import exported, load, save

from mount.helpers import Mounter


def test_weights_read_with_cat_and_numpy(tmp_path: Path, mounter: Mounter) -> None:
    path = save(exported(), tmp_path / "model.pt2")
    ep = load(path)
    mnt = mounter(path)
    assert sorted(os.listdir(mnt / "model")) == ["constants", "model.safetensors", "weights"]
    weights = mnt / "model" / "weights"
    for fqn in ("lin.weight", "lin2.weight", "pa", "hb", "b_uint16"):
        cat = subprocess.run(["cat", str(weights / fqn)], capture_output=True, check=True)
        assert cat.stdout == torch_bytes(ep.state_dict[fqn]), fqn
    sidecar = json.loads((weights / "grid.json").read_bytes())
    array = np.memmap(weights / "grid", sidecar["numpy_dtype"], "r", shape=tuple(sidecar["shape"]))
    assert np.array_equal(array, ep.state_dict["grid"].numpy())
    assert os.readlink(weights / "tied.weight") == "lin.weight"
    assert (weights / "tied.weight").read_bytes() == torch_bytes(ep.state_dict["tied.weight"])
    assert (mnt / "model" / "constants" / "const").read_bytes() == torch_bytes(ep.constants["const"])
    index = json.loads((mnt / ".ckptfs" / "index.json").read_bytes())
    assert index["format"] == "pt2"
