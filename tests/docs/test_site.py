"""The docs site builds with ``mkdocs build --strict``: a broken link, a missing anchor or a page left out of the
navigation fails the build, and so this test."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """Not with -q: mkdocs then drops the warnings before --strict counts them, and builds."""
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(root / "mkdocs.yml"),
                           "-d", str(site)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def test_docs_build_strictly(tmp_path: Path) -> None:
    proc = build(REPO, tmp_path / "site")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "site" / "mount" / "index.html").is_file()


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    copy = tmp_path / "repo"
    copy.mkdir()
    shutil.copy(REPO / "mkdocs.yml", copy / "mkdocs.yml")
    shutil.copytree(REPO / "docs", copy / "docs")
    page = copy / "docs" / "cli.md"
    page.write_text(page.read_text() + "\nSee [the missing page](missing.md) and [a lost anchor](mount.md#nowhere).\n")
    proc = build(copy, tmp_path / "site")
    assert proc.returncode != 0
    assert "missing.md" in proc.stderr and "nowhere" in proc.stderr
