"""Real checkpoints written by torch: the seeds that get truncated and mutated.

Run as ``python seeds.py OUTDIR`` (torch is imported only here, in that process).
Small on purpose: every byte of them gets truncated and fuzzed.

Every seed is the same bytes in every run, whatever the interpreter, the hash seed, the time or
the checkout's path: values come from seeded generators, legacy storage keys are fixed
(``legacy_writer``), the re-zipped archive keeps the source's timestamps, and the TorchScript
module is compiled from source text under a fixed file name (TorchScript records the file name of
every function it compiles, torch's own included).
"""

from __future__ import annotations

import io
import linecache
import sys
import types
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
    "tar_py2.pt",
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


SCRIPT_FILE = "ckptfs_seed_module.py"
"""The file name TorchScript records for the seed module's code (no such file exists)."""
SCRIPT_SOURCE = """\
import torch
from torch import nn


class Affine(nn.Module):
    def __init__(self, rows: int, cols: int, gen: torch.Generator) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(rows, cols, generator=gen))
        self.bias = nn.Parameter(torch.randn(rows, generator=gen))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.addmm(self.bias, x, self.weight.t()))


class Stack(nn.Sequential):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self:
            x = layer(x)
        return x
"""


def _scripted() -> object:
    """A two-layer ``nn.Sequential`` (children ``0`` and ``1``) scripted from ``SCRIPT_SOURCE``."""
    import torch

    name = SCRIPT_FILE.removesuffix(".py")
    module = sys.modules.get(name)
    if module is None:  # compiled once per process: a second class of the same name would be renamed
        module = types.ModuleType(name)
        module.__file__ = SCRIPT_FILE
        linecache.cache[SCRIPT_FILE] = (len(SCRIPT_SOURCE), None, SCRIPT_SOURCE.splitlines(True), SCRIPT_FILE)
        exec(compile(SCRIPT_SOURCE, SCRIPT_FILE, "exec"), module.__dict__)
        sys.modules[name] = module
    gen = torch.Generator().manual_seed(5)
    return torch.jit.script(module.Stack(module.Affine(2, 3, gen), module.Affine(2, 2, gen)))


def write_seeds(out: Path) -> None:
    import warnings

    import torch
    from legacy_writer import save_legacy_reproducibly
    from tar_writer import STORAGE_CLASS, tar_checkpoint

    from hostile.truncate import tar_member_offsets

    warnings.filterwarnings("ignore")

    out.mkdir(parents=True, exist_ok=True)
    state = _state()
    torch.save(state, out / "zip_state.pt")
    torch.save(state, out / "zip_proto4.pt", pickle_protocol=4)
    torch.save(_exotic(), out / "zip_exotic.pt")
    save_legacy_reproducibly(state, out / "legacy_state.pt")
    exotic = _exotic()
    del exotic["sparse"]  # legacy sparse needs the same records; keep the legacy seed simple
    save_legacy_reproducibly(exotic, out / "legacy_exotic.pt")

    torch.jit.save(_scripted(), str(out / "torchscript.pt"))

    buffer = io.BytesIO()
    with zipfile.ZipFile(out / "zip_state.pt") as src, zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            renamed = zipfile.ZipInfo("renamed/" + info.filename.split("/", 1)[1], info.date_time)
            dst.writestr(renamed, src.read(info), zipfile.ZIP_DEFLATED)
    (out / "rezipped.pt").write_bytes(buffer.getvalue())

    flat = {k: v for k, v in state.items() if isinstance(v, torch.Tensor) and v.dtype in STORAGE_CLASS}
    tar = tar_checkpoint({**flat, "step": 7}, py2=True)
    # Cut tarfile's padding to 10240 bytes after the two end blocks: a cut anywhere then loses data or framing.
    (out / "tar_py2.pt").write_bytes(tar[: tar_member_offsets(tar)[-1] + 1024])


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # legacy_writer, beside the tests
    write_seeds(Path(sys.argv[1]))
