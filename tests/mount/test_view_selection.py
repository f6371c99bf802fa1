"""``-o views=LIST`` and ``-o noviews``: which files a real mount shows beside the tensors, seen by find, ls, cat and
numpy; the index names only what is shown, and a view left out is not found by its path either."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from corpus import save_zip

from ckptfs.fuse.mount_options import MountOptions, with_options
from mount.helpers import Mounter

pytestmark = pytest.mark.mount

W = torch.arange(12.0).reshape(3, 4)
B = torch.tensor([1, 2, 3], dtype=torch.int8)


@pytest.fixture
def source(tmp_path: Path) -> Path:
    return save_zip({"m": {"w": W, "tied": W}, "b": B, "epoch": 3}, tmp_path / "model.pt")


def _found(mnt: Path) -> list[str]:
    out = subprocess.run(["find", str(mnt)], capture_output=True, text=True, check=True).stdout
    return sorted(os.path.relpath(line, mnt) for line in out.splitlines())


def _index(mnt: Path) -> dict:
    return json.loads((mnt / ".ckptfs" / "index.json").read_bytes())


def test_every_view_by_default(source: Path, mounter: Mounter) -> None:
    mnt = mounter(source)
    assert _found(mnt) == [".", ".ckptfs", ".ckptfs/index.json", "b", "b.json", "b.npy", "epoch", "m",
                           "m/model.safetensors", "m/tied", "m/tied.json", "m/tied.npy", "m/w", "m/w.json",
                           "m/w.npy", "model.safetensors"]
    assert (mnt / ".zarr" / "zarr.json").exists()  # by its path, not listed


def test_noviews_shows_tensor_files_values_links_and_the_index_only(source: Path, mounter: Mounter) -> None:
    mnt = mounter(source, "-o", "noviews")
    assert _found(mnt) == [".", ".ckptfs", ".ckptfs/index.json", "b", "epoch", "m", "m/tied", "m/w"]
    for gone in ("m/w.json", "m/w.npy", "m/tied.json", "model.safetensors", ".zarr", ".zarr/zarr.json"):
        assert not os.path.lexists(mnt / gone), gone
    assert (mnt / "m" / "w").read_bytes() == W.numpy().tobytes()
    assert os.readlink(mnt / "m" / "tied") == "w"
    index = _index(mnt)
    assert index["safetensors"] == [] and index["zarr"] is None
    assert [sorted(t) for t in index["tensors"]] == [["dtype", "file", "id", "nbytes", "parent", "path", "shape"]] * 2


def test_views_list_keeps_the_named_ones(source: Path, mounter: Mounter) -> None:
    mnt = mounter(source, "-o", "ro,views=npy,zarr,noatime")
    assert _found(mnt) == [".", ".ckptfs", ".ckptfs/index.json", "b", "b.npy", "epoch", "m", "m/tied", "m/tied.npy",
                           "m/w", "m/w.npy"]
    assert np.array_equal(np.load(mnt / "m" / "w.npy"), W.numpy())
    assert os.readlink(mnt / "m" / "tied.npy") == "w.npy"
    assert not os.path.lexists(mnt / "m" / "w.json")
    assert json.loads((mnt / ".zarr" / "m" / "w" / "zarr.json").read_bytes())["shape"] == [3, 4]
    listed = subprocess.run(["ls", "-a", str(mnt / "m")], capture_output=True, text=True, check=True).stdout.split()
    assert listed == [".", "..", "tied", "tied.npy", "w", "w.npy"]
    tensors = _index(mnt)["tensors"]
    assert [t.get("npy") for t in tensors] == ["m/w.npy", "b.npy"] and all("sidecar" not in t for t in tensors)


def test_views_spelled_with_colons_and_all() -> None:
    assert with_options(MountOptions(), ["views=json:safetensors"]).views == {"json", "safetensors"}
    assert with_options(MountOptions(), ["noviews,views=all"]).views == MountOptions().views
    assert with_options(MountOptions(), ["views=json,npy", "views=zarr"]).views == {"zarr"}
    assert with_options(MountOptions(), ["views="]).views == frozenset()
