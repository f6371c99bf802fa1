"""``ckptfs diff`` run as a user would, on checkpoints torch wrote with known changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from corpus import save_legacy

from ckptfs.cli.compare import CHUNK_ELEMENTS

CLI = [sys.executable, "-m", "ckptfs.cli"]


def diff(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "diff", *map(str, args)], capture_output=True, text=True, timeout=120)


def diff_json(*args: str | Path) -> tuple[int, dict[str, dict[str, Any]], dict[str, Any]]:
    result = diff("--json", *args)
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert result.stderr == ""
    return result.returncode, {line["key"]: line for line in lines[:-1]}, lines[-1]["summary"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(15)
    embed = torch.randn(40, 8, generator=gen)
    a = {"embed.weight": embed, "lm_head.weight": embed, "proj": torch.randn(6, 5, generator=gen).t(),
         "bias": torch.zeros(5), "bf": torch.randn(9, generator=gen).bfloat16(), "steps": torch.arange(4),
         "gone": torch.ones(3), "f8": torch.randn(4, generator=gen).to(torch.float8_e5m2),
         "z": torch.randn(3, dtype=torch.complex64, generator=gen)}
    b = {key: value.clone() for key, value in a.items() if key != "gone"}
    b["proj"][2, 3] -= 0.25
    b["bias"][1] = 3.0
    b["bf"][4] = 2.5
    b["steps"] = b["steps"].to(torch.int32)
    b["f8"][0] = 1.0 if float(a["f8"][0]) != 1.0 else 2.0
    b["z"][1] += 1j
    b["new"] = torch.ones(1)
    directory = tmp_path_factory.mktemp("diff")
    torch.save(a, directory / "a.pt")
    torch.save(b, directory / "b.pt")
    return directory / "a.pt", directory / "b.pt", a, b


def expected_gap(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """The largest |b - a| and |b - a| / |a| over the elements that differ, computed in float64 from torch's values."""
    x, y = a.contiguous().reshape(-1), b.contiguous().reshape(-1)
    x = x.to(torch.complex128) if x.is_complex() else x.to(torch.float64)
    y = y.to(torch.complex128) if y.is_complex() else y.to(torch.float64)
    gaps = [(abs(complex(q) - complex(p)), abs(complex(p))) for p, q in zip(x.tolist(), y.tolist()) if p != q]
    return max(g for g, _ in gaps), max(g / s if s else float("inf") for g, s in gaps)


def test_known_changes_are_reported_exactly(pair: tuple[Path, Path, dict[str, torch.Tensor], dict[str, torch.Tensor]]
                                            ) -> None:
    path_a, path_b, a, b = pair
    status, lines, summary = diff_json(path_a, path_b)
    assert status == 1
    for key in ["proj", "bias", "bf", "z"]:
        max_abs, max_rel = expected_gap(a[key], b[key])
        assert (lines[key]["status"], lines[key]["differing"]) == ("differ", 1), key
        assert lines[key]["max_abs"] == pytest.approx(max_abs, rel=1e-15, abs=0), key
        assert lines[key]["max_rel"] == (pytest.approx(max_rel, rel=1e-15) if max_rel != float("inf") else "inf"), key
    assert lines["bias"]["max_rel"] == "inf" and lines["bias"]["max_abs"] == 3.0
    assert {name: lines["f8"][name] for name in ["status", "differing", "max_abs", "max_rel", "partial"]} == \
        {"status": "differ", "differing": 1, "max_abs": None, "max_rel": None, "partial": False}  # no numpy float8
    assert lines["steps"]["status"] == "changed"
    assert (lines["steps"]["a"]["dtype"], lines["steps"]["b"]["dtype"]) == ("int64", "int32")
    assert lines["gone"]["status"] == "only_in_a" and lines["new"]["status"] == "only_in_b"
    assert lines["embed.weight"]["status"] == lines["lm_head.weight"]["status"] == "equal"
    assert (lines["lm_head.weight"]["a"]["alias_of"], lines["lm_head.weight"]["b"]["alias_of"]) == ("embed.weight", None)
    assert summary | {"seconds": 0} == {"tensors": 10, "equal": 2, "differ": 5, "changed": 1, "only_in_a": 1,
                                        "only_in_b": 1, "error": 0, "aliases": 1, "bytes_read": summary["bytes_read"],
                                        "values": {"total": 0, "equal": 0, "differ": 0, "only_in_a": 0,
                                                   "only_in_b": 0}, "seconds": 0}


def test_text_output_and_summary(pair: tuple[Path, Path, dict[str, torch.Tensor], dict[str, torch.Tensor]]) -> None:
    path_a, path_b, _, _ = pair
    result = diff(path_a, path_b)
    assert result.returncode == 1 and result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[:2] == ["differs    proj   1 of 30 elements, max abs 0.25, max rel " + lines[0].rsplit(" ", 1)[1],
                         "differs    bias   1 of 5 elements, max abs 3, max rel inf"]
    assert "changed    steps  int64 4 -> int32 4" in lines
    assert "only in A  gone   float32 3" in lines and "only in B  new    float32 1" in lines
    assert not any(line.startswith("equal") for line in lines)
    assert lines[-1].startswith("10 tensor paths (1 alias): 2 equal, 5 differ, 1 changed dtype or shape, 1 only in A, "
                                "1 only in B; 0 other values: 0 equal, 0 differ, 0 only in A, 0 only in B (")
    with_equal = diff("-s", path_a, path_b).stdout.splitlines()
    assert "equal      embed.weight" in with_equal
    assert "equal      lm_head.weight  (alias of embed.weight in A)" in with_equal


def test_the_same_tensors_in_other_formats_and_nestings_are_equal(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(3)
    tied = torch.randn(5, 4, generator=gen)
    state = {"embed.weight": tied, "lm_head.weight": tied, "norm": torch.randn(4, generator=gen).half()[::2]}
    torch.save({"model": state, "step": 9}, tmp_path / "nested.pt")
    flat: dict[str, Any] = {f"model.{key}": value.clone() for key, value in state.items()}
    flat["step"] = 9
    save_legacy(flat, tmp_path / "flat_legacy.pt")
    result = diff(tmp_path / "nested.pt", tmp_path / "flat_legacy.pt")
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.startswith("3 tensor paths (1 alias): 3 equal, 0 differ")
    assert "1 other value: 1 equal" in result.stdout


def test_quick_stops_at_the_first_differing_chunk(tmp_path: Path) -> None:
    a = torch.zeros(3 * CHUNK_ELEMENTS, dtype=torch.float32)
    b = a.clone()
    b[10] = 1.0
    b[2 * CHUNK_ELEMENTS + 10] = 4.0
    torch.save({"w": a}, tmp_path / "a.pt")
    torch.save({"w": b}, tmp_path / "b.pt")
    status, lines, summary = diff_json(tmp_path / "a.pt", tmp_path / "b.pt")
    assert (status, lines["w"]["differing"], lines["w"]["max_abs"], lines["w"]["partial"]) == (1, 2, 4.0, False)
    assert summary["bytes_read"] == 2 * a.numel() * 4
    status, lines, summary = diff_json("--quick", "--threads", "1", tmp_path / "a.pt", tmp_path / "b.pt")
    assert (status, lines["w"]["differing"], lines["w"]["max_abs"], lines["w"]["partial"]) == (1, 1, 1.0, True)
    assert summary["bytes_read"] <= 2 * 2 * CHUNK_ELEMENTS * 4
    text = diff("--quick", "--threads", "1", tmp_path / "a.pt", tmp_path / "b.pt").stdout.splitlines()[0]
    assert text == ("differs    w  at least 1 of 3,145,728 elements, max abs at least 1, max rel at least inf "
                    "(--quick: read up to the first difference)")


def test_trouble_exits_2_with_one_line(tmp_path: Path, pair: tuple[Path, Path, Any, Any]) -> None:
    result = diff(pair[0], tmp_path / "missing.pt")
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == f"ckptfs: {tmp_path}/missing.pt: cannot open: No such file or directory\n"
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    result = diff(tmp_path / "notes.txt", pair[0])
    assert result.returncode == 2 and result.stderr.startswith(f"ckptfs: {tmp_path}/notes.txt: ")
    assert diff("--threads", "0", pair[0], pair[1]).returncode == 2


def test_a_file_against_itself_or_a_hard_link_reads_no_tensor(
        pair: tuple[Path, Path, dict[str, torch.Tensor], dict[str, torch.Tensor]], tmp_path: Path) -> None:
    path_a = pair[0]
    os.link(path_a, tmp_path / "linked.pt")
    for other in (path_a, tmp_path / "linked.pt"):
        status, lines, summary = diff_json(path_a, other)
        assert (status, summary["equal"], summary["tensors"], summary["bytes_read"]) == (0, 9, 9, 0)


def test_numpy_is_imported_only_when_a_chunk_differs(tmp_path: Path) -> None:
    """Every command line imports the diff's module: numpy (0.1-0.3 s at start) waits until a chunk differs, so
    ``ls``, ``mount`` and a diff of equal checkpoints start without it."""
    torch.save({"w": torch.arange(6.0)}, tmp_path / "a.pt")
    torch.save({"w": torch.arange(6.0) + 1}, tmp_path / "b.pt")
    probe = ("import sys; from ckptfs.cli.main import main; status = main(sys.argv[1:]); "
             "print('numpy' in sys.modules, status, file=sys.stderr)")
    for args, expected in ((["ls", "a.pt"], "False 0"), (["diff", "a.pt", "a.pt"], "False 0"),
                           (["diff", "a.pt", "b.pt"], "True 1")):
        result = subprocess.run([sys.executable, "-c", probe, *args], cwd=tmp_path, capture_output=True, text=True,
                                timeout=120)
        assert result.stderr.strip().splitlines()[-1] == expected, (args, result.stderr)
