"""``ckptfs fill SKELETON --from SRC``: a skip_data skeleton filled from any checkpoint ckptfs reads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from corpus import save_legacy

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "writing"))
from skeletons import assert_crcs_verify, assert_loads_equal, save_skeleton, sha256, state  # noqa: E402

CLI = [sys.executable, "-m", "ckptfs.cli"]


def _fill(skeleton: Path, source: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "fill", str(skeleton), "--from", str(source)], capture_output=True, text=True,
                          timeout=120)


def _dcp(path: Path) -> Path:
    from dcp_writers import save

    save(state(), path)
    return path


SOURCES = {
    "zip": lambda path: (torch.save(state(), path), path)[1],
    "legacy": lambda path: (save_legacy(state(), path), path)[1],
    "dcp": _dcp,
}


@pytest.mark.parametrize("kind", SOURCES)
def test_fill_copies_every_tensor_of_the_source_into_the_skeleton(kind: str, tmp_path: Path) -> None:
    skeleton = save_skeleton(tmp_path / "skel.pt")
    source = SOURCES[kind](tmp_path / f"source-{kind}")
    result = _fill(skeleton, source)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert result.stdout.startswith(f"{skeleton}: ") and "tensors filled" in result.stdout
    assert_loads_equal(skeleton)
    assert_crcs_verify(skeleton)


def test_a_dtype_or_shape_that_differs_is_refused_naming_the_key_and_nothing_is_written(tmp_path: Path) -> None:
    skeleton = save_skeleton(tmp_path / "skel.pt")
    other = state()
    other["nested"]["bf"] = other["nested"]["bf"].float()
    source = tmp_path / "other.pt"
    torch.save(other, source)
    before = sha256(skeleton)
    result = _fill(skeleton, source)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == (f"ckptfs: {skeleton}: key nested.bf: {source} has float32 [3, 4], the file reserves "
                             "bfloat16 [3, 4]\n")
    assert sha256(skeleton) == before


def test_a_key_the_skeleton_lacks_is_refused(tmp_path: Path) -> None:
    skeleton = save_skeleton(tmp_path / "skel.pt")
    source = tmp_path / "more.pt"
    torch.save({**state(), "extra": torch.ones(2)}, source)
    before = sha256(skeleton)
    result = _fill(skeleton, source)
    assert result.returncode == 1
    assert result.stderr == f"ckptfs: {skeleton}: no tensor under key extra (which {source} has)\n"
    assert sha256(skeleton) == before


def test_a_skeleton_that_cannot_be_written_is_refused_in_one_line(tmp_path: Path) -> None:
    legacy = tmp_path / "legacy.pt"
    save_legacy(state(), legacy)
    before = sha256(legacy)
    result = _fill(legacy, legacy)
    assert result.returncode == 1
    assert result.stderr == (f"ckptfs: {legacy}: cannot be opened for writing: a legacy (torch < 1.6) file: only "
                             "torch.save zip archives are written in place\n")
    assert sha256(legacy) == before


def test_views_whose_bytes_no_written_tensor_covers_are_refused(tmp_path: Path) -> None:
    base = torch.arange(100, dtype=torch.float32)
    layout = {"all": base, "part": base[10:20]}
    with torch.serialization.skip_data():
        torch.save(layout, tmp_path / "skel.pt")
    torch.save(layout, tmp_path / "src.pt")
    before = sha256(tmp_path / "skel.pt")
    result = _fill(tmp_path / "skel.pt", tmp_path / "src.pt")
    assert result.returncode == 1
    assert result.stderr == (f"ckptfs: {tmp_path / 'skel.pt'}: tensor all is read-only: another tensor views part "
                             "of its bytes differently\n")
    assert sha256(tmp_path / "skel.pt") == before
