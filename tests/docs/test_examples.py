"""Every shell and Python example of the README and of docs/ runs, against the example checkpoint, and shows
the output its page shows (``examples.py`` says how a page's blocks are read and run)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Iterator

import pytest
import torch
from examples import RUN_LANGUAGES, blocks, console_commands, output_matches, run_block
from mount.helpers import force_unmount, mount_points

REPO = Path(__file__).resolve().parent.parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
EXAMPLE = REPO / "examples" / "tiny_model.pt"


def page_id(page: Path) -> str:
    return str(page.relative_to(REPO))


def session_env() -> dict[str, str]:
    """The venv's commands (ckptfs, python3) first on PATH, as after the README's install lines."""
    bindir = os.path.dirname(sys.executable)
    return {**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", "")}


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "examples").mkdir()
    shutil.copy(EXAMPLE, tmp_path / "examples" / "tiny_model.pt")
    shutil.copy(EXAMPLE, tmp_path / "model.pt")
    yield tmp_path
    for point in mount_points():
        if point.startswith(str(tmp_path) + "/"):
            force_unmount(Path(point))


@pytest.mark.mount
@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_page_examples_run(page: Path, session: Path) -> None:
    for block in blocks(page.read_text()):
        if block.language in RUN_LANGUAGES and block.not_run is None:
            run_block(block, session, session_env(), sys.executable)


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_block_says_its_language(page: Path) -> None:
    """A block without a language would be neither run nor said to be text."""
    unnamed = [block.line for block in blocks(page.read_text()) if not block.language]
    assert unnamed == [], f"{page_id(page)}: fenced blocks without a language at lines {unnamed}"


def test_not_run_is_rare() -> None:
    skipped = [(page_id(page), block.line, block.not_run) for page in PAGES for block in blocks(page.read_text())
               if block.language in RUN_LANGUAGES and block.not_run is not None]
    run = [block for page in PAGES for block in blocks(page.read_text())
           if block.language in RUN_LANGUAGES and block.not_run is None]
    assert len(skipped) <= len(run), skipped


def test_output_comparison() -> None:
    """The runner's own rules: exact lines, trailing spaces ignored, ``...`` for any lines."""
    assert output_matches(["a", "...", "d"], "a\nb\nc\nd\n")
    assert output_matches(["a", "..."], "a\n")
    assert output_matches(["a  "], "a\n")
    assert not output_matches(["a", "d"], "a\nb\nd\n")
    assert not output_matches(["a"], "a\nb\n")
    assert output_matches(["x (...) y"], "x (5.8 KiB in 0.03 s) y\n")
    assert not output_matches(["x (...) y"], "x (5.8 KiB) z\n")
    assert [c.text for c in console_commands("$ echo a \\\nb\na b\n$ true\n")] == ["echo a \nb", "true"]


HEADLINE_DTYPES = {
    "bfloat16": torch.bfloat16, "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2,
    "float16": torch.float16, "complex64": torch.complex64, "bool": torch.bool, "int8": torch.int8,
    "uint8": torch.uint8, "float64": torch.float64,
}


def headline_example() -> str:
    """The README's first Python example: memmap of a tensor file with the dtype its sidecar gives."""
    return next(b.text for b in blocks((REPO / "README.md").read_text()) if b.language == "python")


@pytest.mark.mount
def test_headline_numpy_example_reads_every_dtype(tmp_path: Path) -> None:
    """Issue 22 item 2: the README's np.memmap example, on a tensor of each dtype, gives torch's bytes."""
    from mount.helpers import run_cli

    gen = torch.Generator().manual_seed(22)
    values = torch.randn(3, 5, generator=gen)
    state = {name: (values > 0 if dtype is torch.bool else (values * 10).to(dtype))
             for name, dtype in HEADLINE_DTYPES.items()}
    state["complex64"] = torch.complex(values, -values)
    torch.save(state, tmp_path / "dtypes.pt")
    mnt = tmp_path / "m"
    mnt.mkdir()
    assert run_cli("mount", tmp_path / "dtypes.pt", mnt).returncode == 0
    try:
        for name, tensor in state.items():
            code = headline_example().replace('"m/model/layers.2.bias"', repr(str(mnt / name)))
            # the example's own print first (stdout is block-buffered unless PYTHONUNBUFFERED is set)
            code += "\nimport sys; sys.stdout.flush(); sys.stdout.buffer.write(np.ascontiguousarray(w).tobytes())\n"
            proc = __import__("subprocess").run([sys.executable, "-c", code], capture_output=True, timeout=60)
            assert proc.returncode == 0, (name, proc.stderr.decode()[-1500:])
            raw = tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
            assert proc.stdout.endswith(raw), name
            assert proc.stdout[:proc.stdout.index(b" ")].decode() == name
    finally:
        force_unmount(mnt)
