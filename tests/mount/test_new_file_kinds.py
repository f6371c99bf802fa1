"""Files of forms added for issue 14, read through a real mount with real programs."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import warnings
import zipfile
from pathlib import Path

import pytest
import torch
from big_endian import save_big_endian
from corpus import save_zip, torch_bytes
from tar_writer import tar_checkpoint

from mount.helpers import Mounter

pytestmark = [pytest.mark.mount, pytest.mark.filterwarnings("ignore:TypedStorage")]


def _cat(*files: Path) -> bytes:
    return subprocess.run(["cat", *map(str, files)], capture_output=True, check=True).stdout


def test_quantized_scales_and_zero_points_read_with_cat(tmp_path: Path, mounter: Mounter) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        w = torch.quantize_per_channel(torch.linspace(-2, 2, 12).reshape(3, 4),
                                       torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64), torch.tensor([0, 1, 2]), 0,
                                       torch.qint8)
    path = save_zip({"layer": {"w": w, "tied": w}}, tmp_path / "q.pt")
    expected = torch.load(path)["layer"]["w"]
    mnt = mounter(path)
    layer = mnt / "layer"
    assert sorted(os.listdir(layer)) == ["model.safetensors", "tied", "tied.json", "tied.npy", "tied.q_scales",
                                         "tied.q_zero_points", "w", "w.json", "w.npy", "w.q_scales", "w.q_zero_points"]
    assert _cat(layer / "w") == torch_bytes(expected)
    assert _cat(layer / "w.q_scales") == torch_bytes(expected.q_per_channel_scales())
    assert _cat(layer / "tied.q_zero_points") == torch_bytes(expected.q_per_channel_zero_points())
    assert os.readlink(layer / "tied.q_scales") == "w.q_scales"
    assert (layer / "w.q_scales").stat().st_size == 24
    index = json.loads((mnt / ".ckptfs" / "index.json").read_bytes())
    assert {t["file"]: t.get("q_scales") for t in index["tensors"]} == {"layer/w": "layer/w.q_scales"}


def test_a_skip_data_file_mounts_with_its_storages_marked_unwritten(tmp_path: Path, mounter: Mounter) -> None:
    path = tmp_path / "skip.pt"
    with torch.serialization.skip_data():
        torch.save({"w": torch.arange(6.0), "b": torch.ones(2, dtype=torch.int64)}, path)
    loaded = torch.load(path)
    mnt = mounter(path)
    for name in ("w", "b"):
        sidecar = json.loads((mnt / f"{name}.json").read_bytes())
        assert sidecar["storage"]["written"] is False
        assert _cat(mnt / name) == torch_bytes(loaded[name])


def test_big_endian_tensors_read_little_endian_with_cat(tmp_path: Path, mounter: Mounter) -> None:
    path = tmp_path / "big.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        state = {"u32": torch.tensor([1, 0xDEADBEEF], dtype=torch.uint32),
                 "c32": torch.tensor([1.5 - 2j], dtype=torch.complex32),
                 "f64_t": torch.arange(6.0).double().reshape(2, 3).t()}
        save_big_endian(state, path)
    mnt = mounter(path)
    assert _cat(mnt / "u32") == struct.pack("<2I", 1, 0xDEADBEEF)
    assert _cat(mnt / "c32") == struct.pack("<2e", 1.5, -2.0)
    assert _cat(mnt / "f64_t") == struct.pack("<6d", 0, 3, 1, 4, 2, 5)


def test_a_tar_checkpoint_of_old_torch_reads_with_cat(tmp_path: Path, mounter: Mounter) -> None:
    weights = torch.linspace(-1, 1, 12).reshape(3, 4)
    path = tmp_path / "old.pt"
    path.write_bytes(tar_checkpoint({"w": weights, "wt": weights.t(), "ids": torch.tensor([7, 1 << 40]), "step": 3},
                                    py2=True))
    loaded = torch.load(path, weights_only=False)
    mnt = mounter(path)
    assert _cat(mnt / "w", mnt / "wt", mnt / "ids") == b"".join(torch_bytes(loaded[k]) for k in ("w", "wt", "ids"))
    assert _cat(mnt / "step") == b"3\n"
    assert not (mnt / "wt").is_symlink() and json.loads((mnt / "wt.json").read_bytes())["stride"] == [1, 4]


def test_a_deflated_tensor_reads_with_cat_and_dd(tmp_path: Path, mounter: Mounter) -> None:
    gen = torch.Generator().manual_seed(2)
    source = save_zip({"w": torch.randint(0, 8, (2_000_000,), dtype=torch.int32, generator=gen)}, tmp_path / "s.pt")
    path = tmp_path / "deflated.pt"
    with zipfile.ZipFile(source) as zin, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info))
    expected = torch_bytes(torch.load(path)["w"])
    mnt = mounter(path)
    for skip in (1900, 3, 1000):
        out = subprocess.run(["dd", f"if={mnt / 'w'}", "bs=4096", f"skip={skip}", "count=5", "status=none"],
                             capture_output=True, check=True).stdout
        assert out == expected[skip * 4096 : (skip + 5) * 4096], skip
    assert _cat(mnt / "w") == expected
