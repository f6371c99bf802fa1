"""``ckptfs ls`` and ``ckptfs info`` on a torch.export ``.pt2`` archive, whatever its file is named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pt2_writer import exported, save

CLI = [sys.executable, "-m", "ckptfs.cli"]


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=120)


def test_ls_and_info(tmp_path: Path) -> None:
    path = save(exported(), tmp_path / "exported.bin")
    listing = run("ls", path)
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.splitlines()
    assert lines[0].split() == ["model/weights/pa", "float32", "4", "16", "B"]
    tied = [line.split("  ")[0] for line in lines if line.startswith("model/weights/tied.weight")]
    assert tied == ["model/weights/tied.weight -> model/weights/lin.weight"], "a tied weight is an alias"
    assert lines[-1].split()[:2] == ["model/constants/scratch", "float32"]
    rows = [json.loads(line) for line in run("ls", path, "--json").stdout.splitlines()]
    assert {"file": "model/weights/lin2.weight", "path": ["model", "weights", "lin2.weight"], "dtype": "float32",
            "shape": [4, 3], "nbytes": 48} in rows
    info = run("info", path)
    assert info.returncode == 0, info.stderr
    assert "format:     torch.export archive (.pt2)" in info.stdout
    assert "archive prefix: exported" in info.stdout and "models: model" in info.stdout
    described = json.loads(run("info", path, "--json").stdout)
    assert described["format"] == "pt2" and described["details"]["layout"] == "torch.export archive_version 0"
