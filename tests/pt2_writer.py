"""``.pt2`` archives written by torch 2.13 (torch.export.save, package_pt2, the layouts it still loads)."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

DTYPES = [torch.float16, torch.float64, torch.int8, torch.uint8, torch.int16, torch.int32, torch.bool,
          torch.complex64, torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn, torch.float8_e5m2]
"""Buffer dtypes beside the parameters' float32 and bfloat16 and the int64 buffer."""


class Weights(nn.Module):
    """Tied, transposed and offset views of shared storages, every dtype, buffers and constants."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(14)
        self.lin = nn.Linear(4, 3)
        with torch.no_grad():
            self.lin.weight.copy_(torch.randn(3, 4, generator=gen))
            self.lin.bias.copy_(torch.randn(3, generator=gen))
        self.lin2 = nn.Linear(3, 4, bias=False)
        self.lin2.weight = nn.Parameter(self.lin.weight.detach().t())
        base = torch.arange(10, dtype=torch.float32)
        self.pa = nn.Parameter(base[2:6])
        self.pb = nn.Parameter(base[6:9])
        self.tied = self.lin
        self.hb = nn.Parameter(torch.arange(3, dtype=torch.bfloat16) - 1.5)
        self.register_buffer("counts", torch.tensor([7, -8, 2**40], dtype=torch.int64))
        for dtype in DTYPES:
            values = torch.randint(0, 100, (2, 3), generator=gen).to(dtype)
            self.register_buffer(f"b_{str(dtype).removeprefix('torch.')}", values)
        self.register_buffer("grid", torch.arange(24.0).reshape(2, 3, 4).permute(2, 0, 1))
        self.register_buffer("empty", torch.zeros(0, 3))
        self.register_buffer("scratch", torch.full((2,), 0.5), persistent=False)
        self.const = torch.tensor([100.0, 200.0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin2(self.lin(x) + self.tied.bias)
        return (y.sum() + self.pa.sum() + self.pb.sum() + self.hb.float().sum() + self.counts.sum()
                + self.scratch.sum() + self.const.sum() + self.grid.sum())


def exported(module: nn.Module | None = None) -> torch.export.ExportedProgram:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.export.export(module or Weights(), (torch.randn(2, 4),))


def save(ep: torch.export.ExportedProgram, path: Path, **kwargs: Any) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.export.save(ep, path, **kwargs)
    return path


def load(path: Path) -> torch.export.ExportedProgram:
    logging.getLogger("torch.export").setLevel(logging.ERROR)
    logging.getLogger("torch.export.pt2_archive._package").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.export.load(path)


if __name__ == "__main__":
    import sys
    ep = exported()
    print({k: (v.dtype, v.shape) for k, v in ep.state_dict.items()})
    save(ep, Path(sys.argv[1]))
    ep2 = load(Path(sys.argv[1]))
    print(list(ep2.state_dict), list(ep2.constants))
