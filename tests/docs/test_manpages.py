"""The manual pages: made from the parsers, installed with the package, every option in them and no other."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from ckptfs.cli.main import build_parser
from ckptfs.cli.manpage import PAGES
from ckptfs.cli.manpage import page as make_page
from ckptfs.cli.mount_helper import build_parser as build_helper_parser

REPO = Path(__file__).resolve().parent.parent.parent


def page(name: str) -> str:
    return make_page(name, build_parser())


def parsers(name: str) -> list[argparse.ArgumentParser]:
    """The page's parser and, for ckptfs, every command's."""
    top = build_parser() if name == "ckptfs" else build_helper_parser()
    found = [top]
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            found += list(action.choices.values())
    return found


def options_of(name: str) -> set[str]:
    return {option for parser in parsers(name) for action in parser._actions for option in action.option_strings}


def options_in_page(roff: str) -> set[str]:
    """Every option the page sets in bold, as the generator writes them (\\fB\\-\\-json\\fR)."""
    return {m.replace("\\-", "-") for m in re.findall(r"\\fB((?:\\-)+[A-Za-z][\w\\-]*)\\fR", roff)}


@pytest.mark.parametrize("name", sorted(PAGES))
def test_every_option_is_documented_and_every_documented_option_exists(name: str) -> None:
    roff = page(name)
    assert options_in_page(roff) == options_of(name)


@pytest.mark.parametrize("name", sorted(PAGES))
def test_the_installed_copy_is_current(name: str) -> None:
    """man/ holds what the generator makes: regenerate with python -m ckptfs.cli.manpage man."""
    assert (REPO / "man" / PAGES[name][0]).read_text() == page(name)


@pytest.mark.parametrize("name", sorted(PAGES))
def test_man_option_prints_the_page(name: str) -> None:
    argv = ["--man"] if name == "ckptfs" else ["--man", name]
    proc = subprocess.run([sys.executable, "-m", "ckptfs.cli", *argv], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == page(name)


@pytest.mark.skipif(shutil.which("man") is None, reason="no man program (apt-get install man-db)")
@pytest.mark.parametrize("name", sorted(PAGES))
def test_man_renders_the_page_without_warnings(name: str, tmp_path: Path) -> None:
    source = tmp_path / PAGES[name][0]
    source.write_text(page(name))
    proc = subprocess.run(["man", "--warnings", "-l", str(source)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "MANPAGER": "cat", "MANWIDTH": "100"})
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert "COMMANDS" in proc.stdout if name == "ckptfs" else "DESCRIPTION" in proc.stdout


@pytest.mark.skipif(shutil.which("man") is None, reason="no man program (apt-get install man-db)")
def test_man_finds_the_page_of_a_venv_on_path(tmp_path: Path) -> None:
    """As after a venv install: <venv>/bin on PATH, the page in <venv>/share/man/man1 (man-db's MANPATH from PATH)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "share" / "man" / "man1").mkdir(parents=True)
    (venv / "share" / "man" / "man1" / "ckptfs.1").write_text(page("ckptfs"))
    env = {k: v for k, v in os.environ.items() if k != "MANPATH"}
    env.update(PATH=f"{venv / 'bin'}:/usr/bin:/bin", MANPAGER="cat", MANWIDTH="100")
    proc = subprocess.run(["man", "-w", "ckptfs"], capture_output=True, text=True, timeout=60, env=env)
    assert proc.stdout.strip() == str(venv / "share" / "man" / "man1" / "ckptfs.1"), proc.stderr


def test_the_wheel_installs_the_pages_under_share_man(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()  # a copy: setuptools writes build/ and *.egg-info beside pyproject.toml
    for name in ("pyproject.toml", "README.md", "ckptfs", "man"):
        copy = shutil.copytree if (REPO / name).is_dir() else shutil.copy
        copy(REPO / name, source / name)  # type: ignore[operator]
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-cache-dir",
                           "-q", "-w", str(tmp_path), str(source)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    wheel = next(tmp_path.glob("ckptfs-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    data = {name.split(".data/data/", 1)[1] for name in names if ".data/data/" in name}
    assert data == {"share/man/man1/ckptfs.1", "share/man/man8/mount.ckptfs.8"}
