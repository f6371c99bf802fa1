"""``ckptfs ls`` and ``ckptfs info --json`` on every hostile case, each run in a child under 2 s of CPU and 500 MiB."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

import ckptfs
from hostile.cases import CASES, Case
from hostile.checks import TRUNCATION_REASONS, assert_bounded, assert_cli_error
from hostile.conftest import HANG_SECONDS, MEMORY_BOUND, Runner
from hostile.seeds import SEED_NAMES
from hostile.truncate import truncation_offsets

COMMANDS = {"ls": ("ls",), "info_json": ("info", "--json")}
CONSOLE_SCRIPT = Path(sys.executable).with_name("ckptfs")


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_cli(case: Case, command: str, hostile_files: dict[str, Path], runner: Runner) -> None:
    path = hostile_files[case.name]
    result = runner.run(*COMMANDS[command], path)
    assert_bounded(result)
    if case.error is not None:
        assert_cli_error(result, path, case.reason)
        return
    if command == "info_json" and case.describe_reason:
        assert_cli_error(result, path, case.describe_reason)
        return
    assert result.rc == 0 and result.stderr == "", result.stderr
    with ckptfs.open(path) as ck:
        tensors, aliases = len(ck.tensors), ck.alias_count
    if command == "ls":  # a line per tensor, and one per alias (b -> a)
        assert len(result.stdout.splitlines()) == tensors + aliases
    else:
        info = _loads(result.stdout)
        assert info["file"] == str(path) and info["tensor_count"] == tensors == len(info["tensors"])


@pytest.mark.parametrize("seed", SEED_NAMES)
def test_cli_truncated_seed(seed: str, seeds: dict[str, bytes], runner: Runner, tmp_path: Path) -> None:
    data = seeds[seed]
    offsets = truncation_offsets(data)[::6]
    for offset in offsets:
        path = tmp_path / f"cut{offset}"
        path.write_bytes(data[:offset])
        for command in COMMANDS.values():
            result = runner.run(*command, path)
            assert_bounded(result)
            assert_cli_error(result, path, TRUNCATION_REASONS)


def test_debug_shows_the_traceback(hostile_files: dict[str, Path], runner: Runner) -> None:
    path = hostile_files["pid_key_traversal_zip"]
    result = runner.run("--debug", "ls", path)
    assert result.rc != 0
    assert "Traceback" in result.stderr and "bad storage key '../../etc/passwd'" in result.stderr


@pytest.mark.parametrize("name", ["exec_os_system_zip", "dag_tuple_dict_key", "shape_negative", "zip64_count_huge",
                                  "legacy_count_header_lies"])
def test_console_script(name: str, hostile_files: dict[str, Path], runner: Runner) -> None:
    """The installed ``ckptfs`` executable behaves exactly as the forked runs above."""
    path = hostile_files[name]
    for command in COMMANDS.values():
        forked = runner.run(*command, path)
        real = subprocess.run([CONSOLE_SCRIPT, *command, path], capture_output=True, text=True,
                              timeout=HANG_SECONDS, preexec_fn=_limit_memory,
                              env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
        assert (real.returncode, real.stdout, real.stderr) == (forked.rc, forked.stdout, forked.stderr)


def _loads(text: str) -> dict:
    """JSON as deep as the tree limit allows (Python's decoder recurses once per level)."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        return json.loads(text)
    finally:
        sys.setrecursionlimit(limit)


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BOUND, MEMORY_BOUND))
