"""``--help``: every command shows examples, and every example runs as written against the example checkpoint
(``model.pt``, ``before.pt`` and ``after.pt`` are copies of examples/tiny_model.pt; ``/mnt/m`` a fresh directory).
The limits are listed once, by ``--help-limits``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mount.helpers import force_unmount, mount_points

from ckptfs.cli.help_texts import EXAMPLES, limits_help
from ckptfs.limits import Limits

REPO = Path(__file__).resolve().parent.parent.parent
CLI = [sys.executable, "-m", "ckptfs.cli"]
COMMANDS = ("ls", "info", "cat", "diff", "mount", "umount", "mounts", "convert", "fill")


def help_text(*command: str) -> str:
    proc = subprocess.run([*CLI, *command, "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def examples_in(help_output: str) -> list[str]:
    lines = help_output.split("examples:\n", 1)[1].splitlines()
    return [line.strip() for line in lines[:next((i for i, line in enumerate(lines) if not line.strip()), len(lines))]]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_shows_examples_and_not_the_limits(command: str) -> None:
    text = help_text(command)
    assert examples_in(text) and all(line.startswith("ckptfs ") for line in examples_in(text))
    assert "max_tree_depth" not in text


def test_help_limits_lists_every_limit_once() -> None:
    proc = subprocess.run([*CLI, "--help-limits"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == limits_help() + "\n"
    for name in Limits.names():
        assert proc.stdout.count(f"  {name}=") == 1
    assert "max_tree_depth" not in help_text()


@pytest.mark.mount
@pytest.mark.parametrize("command", ("ckptfs", *COMMANDS))
def test_help_examples_run(command: str, tmp_path: Path) -> None:
    for name in ("model.pt", "before.pt", "after.pt", "skeleton.pt", "trained.pt"):
        shutil.copy(REPO / "examples" / "tiny_model.pt", tmp_path / name)
    mnt = tmp_path / "m"
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"], "HOME": str(tmp_path)}
    help_output = help_text() if command == "ckptfs" else help_text(command)
    assert examples_in(help_output) == [line.strip() for line in EXAMPLES[command].splitlines()[1:]]
    for example in examples_in(help_output):
        mnt.mkdir(exist_ok=True)
        if ("/mnt/m" in example or command == "mounts") and not example.startswith("ckptfs mount "):
            # an example about a mount: make one
            subprocess.run([*CLI, "mount", "model.pt", str(mnt)], cwd=tmp_path, check=True, timeout=60)
        try:
            proc = subprocess.run(["bash", "-c", "set -o pipefail; " + example.replace("/mnt/m", str(mnt))],
                                  cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
            assert proc.returncode == 0, (example, proc.stderr[-2000:])
            assert proc.stdout or " -o " in example or "convert" in example or "umount" in example or (
                example.startswith("ckptfs mount ")), example
        finally:
            if str(mnt) in mount_points():
                force_unmount(mnt)
        for made in ("model.safetensors", "weights.npz", "weights", "w.bin", "embed.npy", "resaved.pt"):
            path = tmp_path / made
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
