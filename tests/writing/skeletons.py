"""Skeletons ``torch.serialization.skip_data`` saves, the state they reserve, and ways to check a filled file."""

from __future__ import annotations

import hashlib
import subprocess
import zipfile
from pathlib import Path

import torch


def state() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(26)
    weights = torch.randn(64, 33, generator=gen)
    return {"w": weights, "wt": weights.t(), "tied": weights, "ids": torch.arange(7) * (1 << 40),
            "h": torch.randn(300, generator=gen).to(torch.float16), "b": torch.rand(5, generator=gen) > 0.5,
            "big": torch.randn(256, 1024, generator=gen), "empty": torch.empty(0),
            "nested": {"bf": torch.randn(3, 4, generator=gen).to(torch.bfloat16)}}


def save_skeleton(path: Path, obj: object | None = None) -> Path:
    with torch.serialization.skip_data():
        torch.save(state() if obj is None else obj, path)
    return path


def flat(obj: object, prefix: str = "") -> dict[str, torch.Tensor]:
    """Dotted key → tensor."""
    if isinstance(obj, dict):
        out = {}
        for key, value in obj.items():
            out.update(flat(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: obj}  # type: ignore[dict-item]


def assert_loads_equal(path: Path, expected: dict[str, torch.Tensor] | None = None) -> None:
    """torch.load, plain and with mmap=True, returns ``expected`` (default: ``state()``)."""
    want = flat(state() if expected is None else expected)
    for mmap in (False, True):
        loaded = flat(torch.load(path, mmap=mmap, weights_only=True))
        assert loaded.keys() == want.keys()
        for key, tensor in want.items():
            assert loaded[key].dtype == tensor.dtype and torch.equal(loaded[key], tensor), (key, mmap)


def assert_crcs_verify(path: Path) -> None:
    """zipfile and ``unzip -t`` both check every record's CRC-32."""
    with zipfile.ZipFile(path) as archive:
        assert archive.testzip() is None
    result = subprocess.run(["unzip", "-t", str(path)], capture_output=True, text=True)
    assert result.returncode == 0 and "No errors detected" in result.stdout, result.stdout + result.stderr


def crcs(path: Path) -> dict[str, int]:
    with zipfile.ZipFile(path) as archive:
        return {info.filename.split("/", 1)[1]: info.CRC for info in archive.infolist()}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
