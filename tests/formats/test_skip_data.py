"""Files saved under ``torch.serialization.skip_data``: recognised, marked, fillable from the offsets ckptfs gives."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from corpus import crc32_disabled, torch_bytes

import ckptfs


def _state() -> dict[str, torch.Tensor]:
    weights = torch.linspace(-1, 1, 20).reshape(4, 5)
    return {"w": weights, "wt": weights.t(), "ids": torch.arange(7) * (1 << 40),
            "h": torch.tensor([0.5, 65504.0], dtype=torch.float16), "empty": torch.empty(0)}


def _save_skipped(path: Path) -> Path:
    with torch.serialization.skip_data():
        torch.save(_state(), path)
    return path


def test_storages_reserved_by_skip_data_are_marked_unwritten(tmp_path: Path) -> None:
    with ckptfs.open(_save_skipped(tmp_path / "skip.pt")) as ck:
        assert ck.details["skip_data"] is True
        written = {s.key: s.written for s in ck.storages}
        assert written == {s.key: s.nbytes == 0 for s in ck.storages} and not all(written.values())
        loaded = torch.load(tmp_path / "skip.pt")
        for key, tensor in ck.root.items():
            assert ck.read(tensor) == torch_bytes(loaded[key]), key  # what torch loads: the reserved zeros


def test_ordinary_files_and_files_without_crcs_are_written(tmp_path: Path) -> None:
    torch.save(_state(), tmp_path / "plain.pt")
    with crc32_disabled():
        torch.save(_state(), tmp_path / "nocrc.pt")
    for name in ("plain.pt", "nocrc.pt"):
        with ckptfs.open(tmp_path / name) as ck:
            assert all(s.written for s in ck.storages) and "skip_data" not in ck.details


def test_a_second_pass_fills_the_storages_at_the_offsets_info_gives(tmp_path: Path) -> None:
    """The follow-up skip_data was made for: write each storage's bytes where ``ckptfs info --json`` says."""
    path = _save_skipped(tmp_path / "skip.pt")
    info = subprocess.run([sys.executable, "-m", "ckptfs.cli", "info", "--json", str(path)], capture_output=True,
                          check=True, text=True).stdout
    storages = json.loads(info)["storages"]
    state = _state()
    by_key = {t["storage"]["key"]: name for name, t in zip(state, json.loads(info)["tensors"])}
    with open(path, "r+b") as f:
        for storage in storages:
            assert storage["written"] is (storage["nbytes"] == 0) and storage["compressed"] is False
            if storage["nbytes"]:
                data = state[by_key[storage["key"]]].untyped_storage()
                f.seek(storage["offset"])
                f.write(bytes(data))
    filled = torch.load(path)
    for name, tensor in state.items():
        assert torch.equal(filled[name], tensor), name
    human = subprocess.run([sys.executable, "-m", "ckptfs.cli", "info", str(path)], capture_output=True, check=True,
                           text=True).stdout
    unwritten = [s for s in storages if not s["written"]]
    assert f"unwritten: {len(unwritten)} storages reserved by skip_data, bytes never written:" in " ".join(human.split())
    assert f"{unwritten[0]['key']}: offset {unwritten[0]['offset']:,}, {unwritten[0]['nbytes']:,} bytes" in human
