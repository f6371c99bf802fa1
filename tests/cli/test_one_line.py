"""Every way a command can go wrong is one line (``ckptfs: …``) on the real process, never a traceback: a full
output device, Ctrl-C at any moment, argument mistakes; and the messages say what to do."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
from corpus import save_zip, torch_bytes

import ckptfs.cli.cat
from ckptfs.cli.main import INTERRUPTED, build_parser, main
from ckptfs.errors import SourceError

CLI = [sys.executable, "-m", "ckptfs.cli"]
FULL = "No space left on device"


def run(*args: str | Path, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=60, **kwargs)


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return save_zip({"w": torch.arange(12.0).reshape(3, 4), "b": {"c": torch.ones(2)}, "epoch": 3},
                    tmp_path / "model.pt")


@pytest.mark.parametrize("command", [["--version"], ["--help"], ["ls", "--help"], ["ls", "MODEL"], ["info", "MODEL"],
                                     ["info", "--json", "MODEL"], ["cat", "MODEL", "w"], ["diff", "MODEL", "MODEL"],
                                     ["mounts"]])
def test_output_to_a_full_device_is_one_line(model: Path, command: list[str]) -> None:
    with open("/dev/full", "w") as full:
        result = subprocess.run([*CLI, *(str(model) if arg == "MODEL" else arg for arg in command)], stdout=full,
                                stderr=subprocess.PIPE, text=True, timeout=60)
    if command == ["mounts"] and result.returncode == 0 and result.stderr == "":
        return  # no mount to list: nothing was written
    assert result.returncode == (2 if command[0] == "diff" else 1)  # diff's trouble is 2, as diff(1)'s
    assert result.stderr.splitlines() == [f"ckptfs: writing the output: {FULL}"], result.stderr


COMMANDS = {"ls": ["ls", "MODEL"], "info": ["info", "--json", "MODEL"], "diff": ["diff", "MODEL", "MODEL"],
            "cat": ["cat", "MODEL", "w", "-o", "OUT"], "convert": ["convert", "MODEL", "OUT"]}


@pytest.fixture(scope="module")
def stalled_url() -> Iterator[str]:
    """A URL whose server takes the connection and never answers: a command reading it is still running
    whenever a signal comes, however fast the machine."""
    with socket.create_server(("127.0.0.1", 0), backlog=64) as server:
        yield f"http://127.0.0.1:{server.getsockname()[1]}/model.pt"


@pytest.mark.parametrize("source", ["file", "stalled URL"])
@pytest.mark.parametrize("name", COMMANDS)
def test_ctrl_c_at_any_moment_is_one_line_and_130(model: Path, stalled_url: str, tmp_path: Path, name: str,
                                                  source: str) -> None:
    """SIGINT while the interpreter imports ckptfs, parses the arguments, reads, writes or exits: either the
    command completes, or it prints the one line and exits 130 (and leaves no partial output). Against a server
    that never answers, no command can complete first, so every outcome must be the line and 130."""
    outcomes = set()
    checkpoint = str(model) if source == "file" else stalled_url
    for n, delay in enumerate([0.2, 0.23, 0.26, 0.29, 0.32, 0.35, 0.38, 0.41, 0.5, 0.7]):
        out = tmp_path / f"out{n}.safetensors"
        argv = [checkpoint if arg == "MODEL" else str(out) if arg == "OUT" else arg for arg in COMMANDS[name]]
        process = subprocess.Popen([*CLI, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
        if process.returncode == 0:
            assert stderr == "", stderr
            assert not argv[-1].endswith(out.name) or out.exists()
            outcomes.add("completed")
        else:
            assert (process.returncode, stderr) == (INTERRUPTED, "ckptfs: interrupted\n"), (delay, stderr)
            assert not out.exists()
            outcomes.add("interrupted")
        assert not list(tmp_path.glob("*partial*"))
    if source == "stalled URL":
        assert outcomes == {"interrupted"}


def test_info_indent_without_json_is_a_usage_error(model: Path) -> None:
    result = run("info", "--indent", "2", model)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.splitlines()[-1] == "ckptfs info: error: --indent lays out --json's output: give --json too"


def _arguments(command: str, model: Path) -> list[str]:
    return {"ls": [str(model)], "info": [str(model)], "cat": [str(model), "w"], "diff": [str(model), str(model)],
            "mount": [str(model), "/mnt"], "convert": [str(model), "o.npz"], "umount": ["/mnt"], "mounts": [],
            "fill": [str(model), "--from", str(model)]}[command]


def test_every_command_takes_the_global_options_before_and_after_it(model: Path) -> None:
    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert set(commands) == {"ls", "info", "cat", "diff", "mount", "convert", "fill", "umount", "mounts"}
    for command in commands:
        for argv in (["--debug", "--limit", "max_tensors=5", command, *_arguments(command, model)],
                     [command, *_arguments(command, model), "--debug", "--limit", "max_tensors=5"]):
            args = build_parser().parse_args(argv)
            assert args.debug is True, argv
            assert dict(args.limit + getattr(args, "command_limit", [])) == {"max_tensors": 5}, argv


def test_umount_and_mounts_take_debug(tmp_path: Path) -> None:
    assert run("mounts", "--debug").returncode == 0
    result = run("umount", "--debug", tmp_path / "absent")
    assert (result.returncode, result.stderr) == (1, f"ckptfs: {tmp_path}/absent: does not exist\n")


@pytest.mark.parametrize(("limit", "message"), [
    ("max_pickle_bytes=100", "zip record 'model/data.pkl' of {} bytes exceeds the limit of 100 "
                             "(limit max_pickle_bytes); to allow more: --limit max_pickle_bytes=VALUE (now 100)"),
    ("max_memo_entries=2", "pickle memo exceeds 2 entries (limit max_memo_entries); to allow more: "
                           "--limit max_memo_entries=VALUE (now 2)"),
])
def test_the_limits_people_hit_say_how_to_raise_them(model: Path, limit: str, message: str) -> None:
    result = run("--limit", limit, "ls", model)
    size = len(zipfile.ZipFile(model).read("model/data.pkl"))
    assert result.returncode == 1
    assert result.stderr == f"ckptfs: {model}: {message.format(size)}\n"


def test_a_truncated_zip_says_it_looks_truncated(model: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.pt"
    cut.write_bytes(model.read_bytes()[: model.stat().st_size // 2])
    result = run("ls", cut)
    assert result.returncode == 1
    assert result.stderr == (f"ckptfs: {cut}: no zip end-of-central-directory record: the file looks truncated "
                             "(a copy cut short, or a save still being written)\n")


def test_a_directory_that_is_no_checkpoint_says_which_directories_are(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    result = run("ls", tmp_path)
    assert result.returncode == 1
    assert result.stderr == (f"ckptfs: {tmp_path}: a directory, but no checkpoint directory: those read are DCP's "
                             "(a .metadata file, torch.distributed.checkpoint) and directories of .safetensors "
                             "files (Hugging Face shards)\n")


@pytest.fixture
def reads_fail_after_one_chunk(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[BaseException]]:
    """``cat`` reads 4 bytes at a time, and the second read raises what the test puts in the list."""
    raised: list[BaseException] = []
    read_content = ckptfs.cli.cat.read_content
    calls = []

    def failing(*args: Any) -> bytes:
        calls.append(args)
        if len(calls) == 2:
            raise raised[0]
        return read_content(*args)

    monkeypatch.setattr(ckptfs.cli.cat, "CHUNK", 4)
    monkeypatch.setattr(ckptfs.cli.cat, "read_content", failing)
    yield raised


@pytest.mark.parametrize("error", [KeyboardInterrupt(), SourceError("cannot read: Input/output error")])
def test_cat_o_interrupted_or_failing_leaves_no_output(model: Path, tmp_path: Path, error: BaseException,
                                                       reads_fail_after_one_chunk: list[BaseException],
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    reads_fail_after_one_chunk.append(error)
    out = tmp_path / "w.bin"
    status = main(["cat", str(model), "w", "-o", str(out)])
    err = capsys.readouterr().err
    if isinstance(error, KeyboardInterrupt):
        assert (status, err) == (INTERRUPTED, "ckptfs: interrupted\n")
    else:
        assert (status, err) == (1, f"ckptfs: {model}: cannot read: Input/output error\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt"]


def test_cat_o_replaces_a_file_whole_and_writes_into_devices(model: Path, tmp_path: Path) -> None:
    out = tmp_path / "w.bin"
    out.write_bytes(b"old")
    assert run("cat", model, "w", "-o", out).returncode == 0
    assert out.read_bytes() == torch_bytes(torch.arange(12.0))
    assert (run("cat", model, "w", "-o", "/dev/null").returncode, os.path.exists("/dev/null.ckptfs-partial")) == (
        0, False)


def test_dcp_and_safetensors_details_read_as_words(tmp_path: Path) -> None:
    from dcp_writers import save
    from safetensors.torch import save_file

    save({"w": torch.ones(4)}, tmp_path / "dcp")
    words = [" ".join(line.split()) for line in run("info", tmp_path / "dcp").stdout.splitlines()]  # any column
    assert "format: distributed checkpoint directory (torch.distributed.checkpoint, DCP)" in words
    assert "details: metadata files: .metadata" in words
    save_file({"x": torch.ones(2)}, tmp_path / "x.safetensors", metadata={"format": "pt", "note": "v2"})
    lines = run("info", tmp_path / "x.safetensors").stdout.splitlines()
    (metadata,) = [line.strip() for line in lines if line.startswith(" ") and line.strip().startswith("metadata: ")]
    assert sorted(metadata.split(": ", 1)[1].split(", ")) == ["format=pt", "note=v2"]  # in the file's order
    assert not any("[" in line or "{" in line for line in lines)


def test_convert_names_its_source_absolute_and_takes_a_trailing_slash_as_a_directory(model: Path,
                                                                                   tmp_path: Path) -> None:
    done = run("convert", "model.pt", "out.safetensors", cwd=tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    data = (tmp_path / "out.safetensors").read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    assert json.loads(data[8 : 8 + length])["__metadata__"]["source"] == str(model)
    done = run("convert", "model.pt", "weights/", cwd=tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    assert sorted(p.name for p in (tmp_path / "weights").rglob("*")) == ["b", "c.npy", "w.npy"]
