"""``ckptfs ls`` and ``ckptfs info`` run as a user would, checked against torch."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from corpus import CorpusFile, Expected, TensorPath, dtype_name, torch_bytes

CLI = [sys.executable, "-m", "ckptfs.cli"]


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=60)


def first_tensors(expected: Expected) -> dict[TensorPath, torch.Tensor]:
    """Each distinct tensor once, at its first path (any path where torch gives no order)."""
    firsts: dict[int, TensorPath] = {}
    for path in expected.first_paths or expected.tensors:
        firsts.setdefault(id(expected.tensors[path]), path)
    return {path: expected.tensors[path] for path in firsts.values()}


def logical_nbytes(t: torch.Tensor) -> int:
    return 0 if t.is_meta else len(torch_bytes(t))


@pytest.mark.parametrize("name", ["r1_views_containers", "r3_legacy", "r5_scripted", "r2_every_dtype_legacy"])
def test_ls_lists_every_tensor(corpus: dict[str, CorpusFile], name: str) -> None:
    result = run("ls", corpus[name].path)
    assert result.returncode == 0 and result.stderr == ""
    expected = first_tensors(corpus[name].expected)
    by_display = {"/".join(map(str, path)): t for path, t in expected.items()}
    rows = [re.split(r"\s{2,}", line) for line in result.stdout.splitlines()]
    assert len(rows) == len(expected)
    if corpus[name].expected.first_paths is not None:
        assert [row[0] for row in rows] == list(by_display)
    for display, dtype, shape, size in rows:
        t = by_display[display]
        assert dtype == dtype_name(t.dtype), display
        assert shape == ("x".join(map(str, t.shape)) if t.dim() else "scalar"), display
        number, unit = size.split()
        scale = {"B": 1, "KiB": 1024, "MiB": 1024**2}[unit]
        assert abs(float(number) * scale - logical_nbytes(t)) < 0.1 * scale, display


def decode_key(key: Any) -> Any:
    if isinstance(key, dict) and list(key) == ["$tuple"]:
        return tuple(decode_key(k) for k in key["$tuple"])
    assert isinstance(key, (str, int)), key
    return key


@pytest.mark.parametrize("name", ["r1_views_containers", "r2_every_dtype", "r2_every_dtype_legacy", "r5_traced"])
def test_info_json_matches_torch(corpus: dict[str, CorpusFile], name: str) -> None:
    entry = corpus[name]
    result = run("info", "--json", entry.path)
    assert result.returncode == 0 and result.stderr == ""
    info = json.loads(result.stdout)
    expected = first_tensors(entry.expected)
    assert (info["file"], info["format"], info["byteorder"]) == (str(entry.path), entry.format, "little")
    assert info["tensor_count"] == len(info["tensors"]) == len(expected)
    assert info["total_nbytes"] == sum(logical_nbytes(t) for t in expected.values())
    data = entry.path.read_bytes()
    ranges = 0
    for meta in info["tensors"]:
        path = tuple(decode_key(k) for k in meta["path"])
        t = expected[path]
        assert meta["dtype"] == dtype_name(t.dtype), path
        assert (meta["shape"], meta["stride"]) == (list(t.shape), list(t.stride())), path
        assert meta["storage_offset"] == t.storage_offset(), path
        assert meta["nbytes"] == logical_nbytes(t), path
        assert meta["requires_grad"] == t.requires_grad, path
        assert meta["is_parameter"] == (path in entry.expected.parameters), path
        for start, end in meta.get("source_ranges") or []:
            # A tensor served straight from the file: those bytes must be torch's.
            assert data[start:end] == torch_bytes(t), path
            ranges += 1
    assert ranges > len(expected) / 3


def test_info_summary(corpus: dict[str, CorpusFile]) -> None:
    entry = corpus["r3_legacy"]
    result = run("info", entry.path)
    assert result.returncode == 0
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines())
    assert lines["format"] == "legacy"
    assert int(lines["tensor_count"]) == entry.expected.distinct


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(("make", "reason"), [
    (lambda d: _write(d / "empty.pt", b""), "empty file"),
    (lambda d: _write(d / "junk.pt", b"\x01\x02junk" * 10), "not a PyTorch checkpoint"),
    (lambda d: d, "a directory"),
    (lambda d: d / "absent.pt", "cannot open"),
    (lambda d: _write(d / "cut.pt", b"PK\x03\x04" + bytes(100)), "no zip end-of-central-directory record"),
])
@pytest.mark.parametrize("command", [["ls"], ["info", "--json"]])
def test_bad_file_is_one_line_on_stderr(tmp_path: Path, make: Any, reason: str, command: list[str]) -> None:
    path = make(tmp_path)
    result = run(*command, path)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"ckptfs: {path}: ") and reason in result.stderr


@pytest.mark.parametrize("command", ["ls", "info"])
def test_limit_option_reaches_the_reader(corpus: dict[str, CorpusFile], command: str) -> None:
    """--limit before or after the command; after it wins."""
    path = corpus["r1_views_containers"].path
    for argv in (["--limit", "max_tree_depth=2", command, path], [command, "--limit", "max_tree_depth=2", path],
                 ["--limit", "max_tree_depth=5", command, "--limit", "max_tree_depth=2", path]):
        result = run(*argv)
        assert result.returncode == 1
        assert result.stderr.strip() == f"ckptfs: {path}: object tree nests deeper than 2 (limit max_tree_depth)"
    assert run("--limit", "max_tree_depth=5", command, path).returncode == 0
    assert run("--limit", "max_tree_depth=2", command, "--limit", "max_tree_depth=5", path).returncode == 0
