"""Real checkpoints written by torch: the seeds that get truncated and mutated.

Run as ``python seeds.py OUTDIR`` (torch is imported only here, in that process).
Small on purpose: every byte of them gets truncated and fuzzed.
"""

from __future__ import annotations

import io
import sys
import zipfile
from collections import OrderedDict
from pathlib import Path

SEED_NAMES = (
    "zip_state.pt",
    "zip_proto4.pt",
    "zip_exotic.pt",
    "legacy_state.pt",
    "legacy_exotic.pt",
    "torchscript.pt",
    "rezipped.pt",
)


def _state() -> dict:
    import torch

    gen = torch.Generator().manual_seed(7)
    base = torch.randn(4, 6, generator=gen)
    return {
        "weight": base,
        "weight_t": base.t(),
        "row": base[2],
        "ids": torch.arange(10, dtype=torch.int64),
        "half": torch.randn(3, 2, generator=gen).half(),
        "bf16": torch.randn(5, generator=gen).bfloat16(),
        "mask": torch.tensor([True, False, True]),
        "param": torch.nn.Parameter(torch.ones(2, 2)),
        "empty": torch.empty(0, 3),
        "scalar": torch.tensor(3.5),
        "meta": OrderedDict(step=7, lr=1e-3, name="run", betas=(0.9, 0.999), tags=["a", "b"], blob=b"\x00\x01"),
        "nested": [{"w": base[1:3]}, (torch.zeros(2, dtype=torch.int8),)],
    }


def _exotic() -> dict:
    import torch

    gen = torch.Generator().manual_seed(11)
    x = torch.randn(4, 3, generator=gen)
    return {
        "q": torch.quantize_per_tensor(x, 0.1, 2, torch.qint8),
        "qc": torch.quantize_per_channel(x, torch.tensor([0.1, 0.2, 0.3, 0.4]), torch.tensor([0, 1, 2, 3]), 0,
                                         torch.quint8),
        "conj": torch.randn(3, dtype=torch.complex64, generator=gen).conj(),
        "sparse": torch.randn(3, 3, generator=gen).relu().to_sparse(),
        "expand": x[1, 2:3].expand(3, 4),
        "u16": torch.arange(6).to(torch.uint16),
        "set": {1, 2, 3},
        "complex": 1 + 2j,
        "int_keys": {1: x[0], (2, 3): x[1]},
    }


def write_seeds(out: Path) -> None:
    import warnings

    import torch

    warnings.filterwarnings("ignore")

    out.mkdir(parents=True, exist_ok=True)
    state = _state()
    torch.save(state, out / "zip_state.pt")
    torch.save(state, out / "zip_proto4.pt", pickle_protocol=4)
    torch.save(_exotic(), out / "zip_exotic.pt")
    torch.save(state, out / "legacy_state.pt", _use_new_zipfile_serialization=False)
    exotic = _exotic()
    del exotic["sparse"]  # legacy sparse needs the same records; keep the legacy seed simple
    torch.save(exotic, out / "legacy_exotic.pt", _use_new_zipfile_serialization=False)

    module = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU()))
    torch.jit.save(module, str(out / "torchscript.pt"))

    buffer = io.BytesIO()
    with zipfile.ZipFile(out / "zip_state.pt") as src, zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr("renamed/" + info.filename.split("/", 1)[1], src.read(info))
    (out / "rezipped.pt").write_bytes(buffer.getvalue())


if __name__ == "__main__":
    write_seeds(Path(sys.argv[1]))
