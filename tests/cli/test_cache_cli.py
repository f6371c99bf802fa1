"""ls and info cache a checkpoint's parse by default ($XDG_CACHE_HOME/ckptfs), in --cache-dir, or not at all
(--no-cache); the output is the same either way."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cache.helpers import written_entries
from many_tensors import save_many, small_zips_cached  # noqa: F401  (fixture)

import ckptfs.cache

CLI = [sys.executable, "-m", "ckptfs.cli"]
pytestmark = pytest.mark.usefixtures("small_zips_cached")


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_many(tmp_path_factory.mktemp("many") / "many.pt", ckptfs.cache.MIN_TENSORS + 200)


def run(*args: str | Path, cache_home: Path) -> str:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_home)}
    result = subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    return result.stdout


@pytest.mark.parametrize("command", [["ls", "--json"], ["info", "--json"], ["info"]])
def test_output_is_the_same_from_the_cache(many: Path, tmp_path: Path, command: list[str]) -> None:
    home = tmp_path / "xdg"
    uncached = run(*command, "--no-cache", many, cache_home=home)
    assert not home.exists()
    first = run(*command, many, cache_home=home)
    assert len(written_entries(home / "ckptfs")) == 1
    again = run(*command, many, cache_home=home)
    assert uncached == first == again


def test_cache_dir_option(many: Path, tmp_path: Path) -> None:
    home, chosen = tmp_path / "xdg", tmp_path / "chosen"
    run("ls", "--cache-dir", chosen, many, cache_home=home)
    assert len(written_entries(chosen)) == 1 and not home.exists()  # its last level made: its parent exists


def unusable_folder(tmp_path: Path, how: str) -> Path:
    """A --cache-dir ckptfs cannot use: a file, or a folder whose metadata/ is another user's or not writable."""
    folder = tmp_path / "cache"
    if how == "under missing folders":
        return tmp_path / "no" / "such" / "cache"
    if how == "a file":
        folder.write_bytes(b"")
        return folder
    (folder / "metadata").mkdir(parents=True)
    if how == "another user's":
        if os.geteuid() != 0:
            pytest.skip("making a folder another user's needs root")
        os.chown(folder / "metadata", 65534, 65534)
    else:
        if os.geteuid() == 0:
            pytest.skip("root may write any folder")
        (folder / "metadata").chmod(0o500)
    return folder


REASONS = {"a file": "cache folder {}/metadata: Not a directory",
           "another user's": "cache folder {}/metadata: not a directory owned by this user",
           "not writable": "cache folder {}/metadata: not readable and writable by this user",
           "under missing folders": "its parent folder {parent} does not exist (only the last level is made)"}


@pytest.mark.parametrize("how", REASONS)
def test_an_unusable_cache_dir_is_one_warning_and_no_cache(many: Path, tmp_path: Path, how: str) -> None:
    folder = unusable_folder(tmp_path, how)
    home = tmp_path / "xdg"
    env = {**os.environ, "XDG_CACHE_HOME": str(home)}
    result = subprocess.run([*CLI, "ls", "--cache-dir", str(folder), str(many)], capture_output=True, text=True,
                            timeout=120, env=env)
    assert result.returncode == 0
    assert result.stdout == run("ls", "--no-cache", many, cache_home=home)
    assert result.stderr.splitlines() == [f"ckptfs: warning: --cache-dir {folder} is unusable: "
                                          f"{REASONS[how].format(folder, parent=folder.parent)}; going on without "
                                          "the cache"]
    assert not home.exists() and not (tmp_path / "no").exists()
    assert how in ("a file", "under missing folders") or not any((folder / "metadata").iterdir())


def test_a_listing_its_reader_stopped_reading_still_writes_the_entry(many: Path, tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # ls writes to a pipe nobody reads: BrokenPipeError at its first line
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    try:
        result = subprocess.run([*CLI, "ls", str(many)], stdout=write_end, stderr=subprocess.PIPE, timeout=120,
                                env=env, check=False)
    finally:
        os.close(write_end)
    assert (result.returncode, result.stderr) == (0, b"")
    assert len(written_entries(tmp_path / "xdg" / "ckptfs")) == 1
