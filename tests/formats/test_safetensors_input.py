"""safetensors files as input: tensors equal to what safetensors wrote, and ``ckptfs diff`` of a checkpoint against
its conversion."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch
from corpus import torch_bytes

import ckptfs
from ckptfs.errors import CorruptCheckpointError

CLI = [sys.executable, "-m", "ckptfs.cli"]
DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.complex64, torch.int64, torch.int32,
          torch.int16, torch.int8, torch.uint64, torch.uint32, torch.uint16, torch.uint8, torch.bool,
          torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz,
          torch.float8_e8m0fnu]


def _tensors() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    made = {f"layer.{n}.{str(dtype).removeprefix('torch.')}": (torch.rand(3, 5, generator=generator) * 100).to(dtype)
            for n, dtype in enumerate(DTYPES)}
    made["scalar"] = torch.tensor(2.5)
    made["empty"] = torch.zeros(0, 4)
    made["f4"] = torch.randint(0, 255, (2, 3), dtype=torch.uint8, generator=generator).view(torch.float4_e2m1fn_x2)
    return made


def test_every_tensor_reads_as_safetensors_wrote_it(tmp_path: Path) -> None:
    tensors = _tensors()
    path = tmp_path / "m.safetensors"
    safetensors.torch.save_file(tensors, path, metadata={"format": "pt", "note": "x"})
    loaded = safetensors.torch.load_file(path)
    with ckptfs.open(path) as ck:
        assert ck.format == "safetensors" and sorted(ck.root) == sorted(tensors)
        assert ck.details["metadata"] == {"format": "pt", "note": "x"}
        for name, value in loaded.items():
            tensor = ck.root[name]
            assert (tensor.dtype.name, tensor.shape) == (str(value.dtype).removeprefix("torch."), tuple(value.shape))
            assert ck.read(tensor) == torch_bytes(value), name
            if tensor.nbytes:
                (extent,) = ck.extents(tensor)
                assert extent.length == tensor.nbytes


def test_a_checkpoint_and_its_conversion_have_no_difference(tmp_path: Path) -> None:
    state = {"model": {"embed.weight": torch.arange(12.0).reshape(3, 4), "head": torch.ones(4, dtype=torch.bfloat16)}}
    torch.save(state, tmp_path / "a.pt")
    subprocess.run([*CLI, "convert", tmp_path / "a.pt", tmp_path / "a.safetensors"], check=True)
    same = subprocess.run([*CLI, "diff", tmp_path / "a.pt", tmp_path / "a.safetensors"], capture_output=True, text=True)
    assert (same.returncode, same.stderr) == (0, ""), same.stdout
    changed = {"model.embed.weight": torch.arange(12.0).reshape(3, 4) + 0.5, "model.head": torch.ones(4).bfloat16()}
    safetensors.torch.save_file(changed, tmp_path / "b.safetensors")
    differ = subprocess.run([*CLI, "diff", tmp_path / "a.pt", tmp_path / "b.safetensors"], capture_output=True,
                            text=True)
    assert differ.returncode == 1, differ.stderr
    assert "differs    model/embed.weight  12 of 12 elements, max abs 0.5" in differ.stdout  # A's file
    assert "model.head" not in differ.stdout


def test_a_header_that_lies_about_sizes_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.safetensors"
    safetensors.torch.save_file({"w": torch.ones(4)}, path)
    data = path.read_bytes().replace(b'"shape":[4]', b'"shape":[5]')
    path.write_bytes(data)
    with pytest.raises(CorruptCheckpointError, match=r"size \(5,\).* needs 20 bytes but storage 'w' holds 16"):
        ckptfs.open(path)
    path.write_bytes(data.replace(b'"shape":[5]', b'"shape":[3]'))
    with pytest.raises(CorruptCheckpointError, match=r"of shape \[3\] \(F32\) needs 12 bytes, its data_offsets give 16"):
        ckptfs.open(path)
