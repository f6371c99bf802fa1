"""Paths that are not regular files: the CLI answers at once with one line, never blocks on a FIFO."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hostile.checks import assert_bounded, assert_cli_error
from hostile.conftest import Runner


def _fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


def _symlink_loop(tmp_path: Path) -> Path:
    path = tmp_path / "loop"
    path.symlink_to(path)
    return path


SPECIAL = {
    "fifo": (_fifo, r"not a regular file, not a checkpoint file"),
    "directory": (lambda tmp: tmp, r"a directory, but no checkpoint directory: those read are DCP.s \(a \.metadata"),
    "char_device": (lambda tmp: Path("/dev/zero"), r"not a regular file, not a checkpoint file"),
    "missing": (lambda tmp: tmp / "missing.pt", r"cannot open: No such file or directory"),
    "symlink_loop": (_symlink_loop, r"cannot open: Too many levels of symbolic links"),
    "proc_file": (lambda tmp: Path("/proc/self/mem"), r"empty file, not a PyTorch checkpoint"),
}


@pytest.mark.parametrize("command", [("ls",), ("info", "--json")], ids=["ls", "info_json"])
@pytest.mark.parametrize("kind", SPECIAL)
def test_special_path(kind: str, command: tuple[str, ...], runner: Runner, tmp_path: Path) -> None:
    make, reason = SPECIAL[kind]
    path = make(tmp_path)
    result = runner.run(*command, path)
    assert_bounded(result)
    assert_cli_error(result, path, reason)
