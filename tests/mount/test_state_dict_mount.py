"""``-o state_dict``: a whole pickled nn.Module mounted under its state_dict() names, as ``ls --state-dict`` shows."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from corpus import save_zip, torch_bytes

from mount.helpers import Mounter, run_cli

pytestmark = pytest.mark.mount


class Tied(torch.nn.Module):
    """A nested Sequential, a persistent and a non-persistent buffer, and a weight tied across two modules."""

    def __init__(self) -> None:
        super().__init__()
        self.seq = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Sequential(torch.nn.Linear(4, 2)))
        self.register_buffer("running", torch.arange(2.0))
        self.register_buffer("scratch", torch.ones(2), persistent=False)
        self.head = torch.nn.Linear(2, 3, bias=False)
        self.embed = torch.nn.Embedding(3, 2)
        self.embed.weight = self.head.weight


def test_a_module_mounted_as_its_state_dict(tmp_path: Path, mounter: Mounter) -> None:
    torch.manual_seed(7)
    model = Tied()
    source = save_zip(model, tmp_path / "whole.pt")
    mnt = mounter(source, "-o", "state_dict,views=json:npy")
    state = model.state_dict()
    assert sorted(name for name in os.listdir(mnt) if "." not in name or not name.endswith((".json", ".npy"))) == \
        sorted([".ckptfs", *state])
    for key, tensor in state.items():
        assert (mnt / key).read_bytes() == torch_bytes(tensor), key
        np.testing.assert_array_equal(np.load(mnt / f"{key}.npy"), tensor.detach().numpy())
    assert os.readlink(mnt / "embed.weight") == "head.weight"
    index = json.loads((mnt / ".ckptfs" / "index.json").read_text())
    assert (index["tensor_count"], index["alias_count"]) == (len(state) - 1, 1)
    listed = [json.loads(line) for line in run_cli("ls", "--json", "--state-dict", source).stdout.splitlines()]
    assert [row["file"] for row in listed] == list(state)
    assert [row["file"] for row in listed if "alias_of" not in row] == [t["file"] for t in index["tensors"]]
