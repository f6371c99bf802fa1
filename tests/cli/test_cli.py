"""``ckptfs ls`` and ``ckptfs info`` run as a user would, checked against torch."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import torch
from corpus import CorpusFile, Expected, TensorPath, dtype_name, save_zip, torch_bytes
from torch import nn

import ckptfs
from ckptfs.cli.main import build_parser
from ckptfs.fuse import dirents
from ckptfs.limits import format_quantity, parse_quantity
from ckptfs.pickle import cscan

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


def decode_key(key: Any) -> Any:
    if isinstance(key, dict) and list(key) == ["$tuple"]:
        return tuple(decode_key(k) for k in key["$tuple"])
    assert isinstance(key, (str, int)), key
    return key


@pytest.mark.parametrize("name", ["r1_views_containers", "r3_legacy", "r5_scripted", "r2_every_dtype_legacy"])
def test_ls_lists_every_tensor(corpus: dict[str, CorpusFile], name: str) -> None:
    """Text and --json list the same tensors, in pickle order, with torch's keys, dtypes, shapes and sizes; each
    other place of a tensor as an alias of it (``b -> a``, ``alias_of``) right after it."""
    text, as_json = run("ls", corpus[name].path), run("ls", "--json", corpus[name].path)
    assert (text.returncode, text.stderr, as_json.returncode, as_json.stderr) == (0, "", 0, "")
    expected = first_tensors(corpus[name].expected)
    every = [json.loads(line) for line in as_json.stdout.splitlines()]
    records = [record for record in every if "alias_of" not in record]
    every_row = [re.split(r"\s{2,}", line) for line in text.stdout.splitlines()]
    rows = [row for row in every_row if " -> " not in row[0]]
    assert [row[0] for row in every_row] == [r["file"] + (f" -> {r['alias_of']}" if "alias_of" in r else "")
                                             for r in every]
    by_file = {record["file"]: record for record in records}
    for alias in every:
        if "alias_of" in alias:
            target = by_file[alias["alias_of"]]
            assert alias["path"] != target["path"] and alias["dtype"] == target["dtype"], alias
            paths = [tuple(decode_key(k) for k in record["path"]) for record in (alias, target)]
            assert corpus[name].expected.tensors[paths[0]] is corpus[name].expected.tensors[paths[1]], alias
    assert len(rows) == len(records) == len(expected)
    paths = [tuple(decode_key(k) for k in record["path"]) for record in records]
    assert len(set(paths)) == len(paths)
    if corpus[name].expected.first_paths is not None:
        assert paths == list(expected)
    for (file, dtype, shape, size), record, path in zip(rows, records, paths):
        t = expected[path]
        assert list(record) == ["file", "path", "dtype", "shape", "nbytes"]
        assert file == record["file"] and not file.startswith("/")
        assert dtype == record["dtype"] == dtype_name(t.dtype), path
        assert record["shape"] == list(t.shape) and shape == ("x".join(map(str, t.shape)) if t.dim() else "scalar")
        assert record["nbytes"] == logical_nbytes(t), path
        number, unit = size.split()
        scale = {"B": 1, "KiB": 1024, "MiB": 1024**2}[unit]
        assert abs(float(number) * scale - logical_nbytes(t)) < 0.1 * scale, path


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
        assert result.stderr == (f"ckptfs: {path}: object tree nests deeper than 2 (limit max_tree_depth); "
                                 "to allow more: --limit max_tree_depth=VALUE (now 2)\n")
    assert run("--limit", "max_tree_depth=5", command, path).returncode == 0
    assert run("--limit", "max_tree_depth=2", command, "--limit", "max_tree_depth=5", path).returncode == 0


def test_version() -> None:
    result = run("--version")
    pyproject = (Path(ckptfs.__file__).parents[1] / "pyproject.toml").read_text()
    (version,) = re.findall(r'^version = "(.+)"$', pyproject, re.MULTILINE)
    assert (result.returncode, result.stderr) == (0, "")
    first, _, rest = result.stdout.partition("\npickle scanner (torch.save zips, DCP .metadata): ")
    path, _, loop = rest.partition("\nlisting loop (mounts): ")
    assert first == f"ckptfs {version}" == f"ckptfs {metadata.version('ckptfs')}"
    assert path == cscan.active_path() and loop == f"{dirents.PATH_NAME}\n"
    assert path.startswith("compiled (_cscan.") == (cscan.LIBRARY is not None)
    assert loop.startswith("compiled (_cdirents.") == (dirents.COMPILED is not None)


@pytest.mark.parametrize("environment,path", [({"CKPTFS_PICKLE_COMPILED": "0"}, "pure Python (CKPTFS_PICKLE_COMPILED=0)"),
                                              ({"CKPTFS_PICKLE_FAST_PATHS": "0"},
                                               "pure Python, the reference (CKPTFS_PICKLE_FAST_PATHS=0)")])
def test_version_names_the_pure_python_path_when_asked(environment: dict[str, str], path: str) -> None:
    result = subprocess.run([*CLI, "--version"], capture_output=True, text=True, env={**os.environ, **environment},
                            timeout=60)
    assert result.stdout.splitlines()[1] == f"pickle scanner (torch.save zips, DCP .metadata): {path}"


def test_version_names_the_python_listing_loop_when_asked() -> None:
    result = subprocess.run([*CLI, "--version"], capture_output=True, text=True,
                            env={**os.environ, "CKPTFS_DIRENTS_COMPILED": "0"}, timeout=60)
    assert result.stdout.splitlines()[2:] == ["listing loop (mounts): Python (CKPTFS_DIRENTS_COMPILED=0)"]


@pytest.mark.parametrize("argv", [["--debug", "ls"], ["ls", "--debug"], ["--debug", "info", "--json"],
                                  ["info", "--debug"], ["info", "--json", "--debug"]])
def test_debug_before_or_after_the_command(tmp_path: Path, argv: list[str]) -> None:
    path = _write(tmp_path / "junk.pt", b"\x01\x02junk" * 10)
    result = run(*argv, path)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith("Traceback (most recent call last):\n")
    assert result.stderr.endswith(f"ckptfs.errors.NotACheckpointError: {path}: not a PyTorch checkpoint "
                                  "(starts with bytes 01 02 6a 75 6e 6b 01 02)\n")
    quiet = run(*[arg for arg in argv if arg != "--debug"], path)
    assert (quiet.returncode, quiet.stderr.count("\n")) == (1, 1) and "Traceback" not in quiet.stderr


@pytest.mark.parametrize(("value", "limit"), [("300", 300), ("1k", 1000), ("1K", 1000), ("2KiB", 2048),
                                              ("1.5KiB", 1536), ("0.001M", 1000), ("1 KiB", 1024), ("1kB", 1000)])
def test_limits_take_units(tmp_path: Path, value: str, limit: int) -> None:
    """max_pickle_bytes: a pickle of 1,025 to 1,535 bytes opens under a limit of 1,536 or 2,048, not under 1,024."""
    path = save_zip({"k": "x" * 1050}, tmp_path / "p.pt")
    size = len(zipfile.ZipFile(path).read("p/data.pkl"))
    assert 1024 < size < 1536
    result = run("ls", "--limit", f"max_pickle_bytes={value}", path)
    if limit >= size:
        assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    else:
        assert result.returncode == 1
        assert result.stderr == (f"ckptfs: {path}: zip record 'p/data.pkl' of {size} bytes exceeds the limit "
                                 f"of {limit} (limit max_pickle_bytes); to allow more: --limit max_pickle_bytes=VALUE "
                                 f"(now {format_quantity(limit, True)})\n")


@pytest.mark.parametrize(("value", "reason"), [
    ("max_tensors=1GB2", "max_tensors: '1GB2' is not a size or count: expected an integer, optionally with a unit"),
    ("max_tensors=-1", "max_tensors: '-1' is not a size or count"),
    ("max_tensors=1.5", "max_tensors: '1.5' is not a whole number"),
    ("max_tensors=", "max_tensors: '' is not a size or count"),
    ("max_tensor=10", "expected NAME=VALUE with NAME one of max_pickle_bytes, max_pickle_inflation"),
    ("max_tensors", "expected NAME=VALUE with NAME one of"),
])
def test_bad_limits_are_refused(tmp_path: Path, value: str, reason: str) -> None:
    result = run("ls", "--limit", value, tmp_path / "never-opened.pt")
    assert result.returncode == 2 and result.stdout == ""
    usage, error = result.stderr.splitlines()
    assert usage.startswith("usage: ckptfs ls ")
    assert error.startswith(f"ckptfs ls: error: argument --limit: {reason}")


LIMIT_DEFAULTS = {
    "max_pickle_bytes": "256MiB", "max_pickle_inflation": "100", "max_inflated_bytes": "1TiB",
    "max_memo_entries": "10M", "max_stack_depth": "10M", "max_zip_entries": "2M", "max_tensors": "5M",
    "max_tree_nodes": "20M", "max_tree_depth": "1000", "max_key_bytes": "64MiB", "max_generated_bytes": "128MiB",
}
"""The README's table of limits, as ``--help`` spells the defaults."""


def test_help_limits_lists_every_limit() -> None:
    result = run("--help-limits")
    assert (result.returncode, result.stderr) == (0, "")
    lines = result.stdout.splitlines()
    assert set(LIMIT_DEFAULTS) == set(ckptfs.Limits.names())
    for name, default in LIMIT_DEFAULTS.items():
        (line,) = [line for line in lines if line.startswith(f"  {name}=")]
        assert line.split()[0] == f"{name}={default}" and len(line.split()) > 2, line
        assert parse_quantity(default) == getattr(ckptfs.Limits(), name)


@pytest.mark.parametrize("command", [[], ["ls"], ["info"], ["mount"]])
def test_help_shows_examples_and_where_the_limits_are(command: list[str]) -> None:
    result = run(*command, "--help")
    assert (result.returncode, result.stderr) == (0, "")
    lines = result.stdout.splitlines()
    assert not [line for line in lines if line.startswith("  max_")]
    assert "limits: ckptfs --help-limits lists the safety limits, their defaults and how to raise them" in lines
    examples = lines.index("examples:")
    assert lines[examples + 1].startswith("  ckptfs " + " ".join(command))


def test_every_command_and_argument_has_help() -> None:
    parser = build_parser()
    (commands,) = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    assert {choice.dest for choice in commands._choices_actions} >= {"ls", "info", "mount", "umount"}
    assert all(choice.help for choice in commands._choices_actions)
    for name, command in [("ckptfs", parser), ("ls", commands.choices["ls"]), ("info", commands.choices["info"])]:
        for action in command._actions:
            assert action.help, (name, action.dest)


def test_info_overview(tmp_path: Path) -> None:
    """Sizes, parameter count, dtypes, tensors and storages, the format in words, details as lines."""
    obj = {"w": nn.Parameter(torch.zeros(3, 4)), "b": torch.zeros(5, dtype=torch.bfloat16), "i": torch.arange(7),
           "t": torch.ones(2, 2).t(), "n": 3}
    path = save_zip(obj, tmp_path / "m.pt")
    result = run("info", path)
    assert (result.returncode, result.stderr) == (0, "")
    archive = zipfile.ZipFile(path)
    assert result.stdout.splitlines() == [
        f"file:       {path}",
        "format:     torch.save zip archive (torch >= 1.6)",
        "size:       130 B of tensor data (130 bytes)",
        "tensors:    4",
        "storages:   4 (130 B stored)",
        "elements:   28 in 4 tensors",
        "parameters: 12 in 1 nn.Parameter",
        "dtypes:     float32   2 tensors  64 B",
        "            int64     1 tensor   56 B",
        "            bfloat16  1 tensor   10 B",
        "byteorder:  little",
        "details:    archive prefix: m",
        f"            records: {len(archive.namelist())}",
        f"            storage alignment: {int(archive.read('m/.storage_alignment'))}",
        f"            format version: {archive.read('m/.format_version').decode().strip()}",
        f"            version: {archive.read('m/version').decode().strip()}",
    ]


def test_info_overview_of_other_formats(corpus: dict[str, CorpusFile]) -> None:
    for name, words in (("r3_legacy", "legacy torch.save stream (torch < 1.6)"),
                        ("r5_scripted", "TorchScript archive (torch.jit.save)")):
        entry = corpus[name]
        result = run("info", entry.path)
        assert (result.returncode, result.stderr) == (0, "")
        fields = dict(line.split(None, 1) for line in result.stdout.splitlines() if not line.startswith(" "))
        assert fields["format:"] == words
        aliases = sum(1 for line in run("ls", "--json", entry.path).stdout.splitlines() if '"alias_of"' in line)
        assert fields["tensors:"] == f"{entry.expected.distinct:,}" + (
            f" (+{aliases} alias{'es' if aliases > 1 else ''}: other places of the same tensors)" if aliases else "")
        first = first_tensors(entry.expected)
        numel = sum(t.numel() for t in first.values())
        parameters = [t for path, t in first.items() if path in entry.expected.parameters]
        assert fields["elements:"] == f"{numel:,} in {len(first):,} tensor{'s' if len(first) > 1 else ''}"
        assert fields.get("parameters:") == (
            f"{sum(t.numel() for t in parameters):,} in {len(parameters):,} "
            f"nn.Parameter{'s' if len(parameters) > 1 else ''}" if parameters else None)
    legacy = run("info", corpus["r3_legacy"].path).stdout
    assert "details:   protocol version: 1001\n           writer little endian: yes\n" in legacy
