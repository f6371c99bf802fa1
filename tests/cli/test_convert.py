"""``ckptfs convert``: safetensors, npz and directories equal to torch's values; clean failures leave nothing."""

from __future__ import annotations

import errno
import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.torch
import torch
from corpus import CorpusFile, save_zip, torch_bytes
from torch import nn

import ckptfs.cli.convert
import ckptfs.saving.output
from ckptfs.cli.convert import Copied, copy_status
from ckptfs.cli.main import INTERRUPTED, main
from ckptfs.fs.safetensors import key_name

CLI = [sys.executable, "-m", "ckptfs.cli"]


def run(*args: str | Path, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, **kwargs)


@pytest.fixture
def checkpoint(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    emb = torch.randn(40, 30)
    state = {**nn.Linear(30, 20).state_dict(), "emb.weight": emb, "head.weight": emb, "t": emb.t()[3:],
             "bf": torch.randn(5).bfloat16(), "s": torch.tensor(7, dtype=torch.int16), "e": torch.empty(0, 3)}
    return save_zip({"model": state, "step": 3}, tmp_path / "ck.pt"), state


def test_to_safetensors(checkpoint: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path) -> None:
    source, state = checkpoint
    out = tmp_path / "out.safetensors"
    done = run("convert", source, out)
    assert (done.returncode, done.stderr) == (0, "")
    loaded = safetensors.torch.load_file(out)
    assert set(loaded) == {"model." + key for key in state}
    for key, t in state.items():
        assert loaded["model." + key].dtype == t.dtype and torch_bytes(loaded["model." + key]) == torch_bytes(t), key
    assert not list(tmp_path.glob("*partial*"))


def test_to_npz_and_dir(checkpoint: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path) -> None:
    source, state = checkpoint
    assert run("convert", source, tmp_path / "out.npz").returncode == 0
    with np.load(tmp_path / "out.npz") as arrays:
        assert set(arrays.files) == {"model." + key for key in state if key != "head.weight"}  # tied: once
        for key in arrays.files:
            assert arrays[key].tobytes() == torch_bytes(state[key.removeprefix("model.")]), key
    assert run("convert", "--to", "dir", source, tmp_path / "out").returncode == 0
    for key, t in state.items():
        if key != "head.weight":
            array = np.load(tmp_path / "out" / "model" / f"{key}.npy", mmap_mode="r" if t.numel() else None)
            assert array.shape == t.shape and array.tobytes() == torch_bytes(t), key
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["model"]


def test_every_corpus_file_converts(corpus: dict[str, CorpusFile], tmp_path: Path) -> None:
    for name, entry in corpus.items():
        out = tmp_path / f"{name}.safetensors"
        done = run("convert", entry.path, out)
        if not entry.expected.tensors:
            continue
        assert done.returncode == 0, done.stderr
        with safetensors.safe_open(out, "pt") as f:
            left_out = json.loads(f.metadata()["left_out"])
            names = set(f.keys())
        for path, t in entry.expected.tensors.items():
            dotted = ".".join(key_name(key) for key in path)
            if dotted in names:
                with safetensors.safe_open(out, "pt") as f:
                    assert torch_bytes(f.get_tensor(dotted)) == torch_bytes(t), (name, dotted)
            else:
                assert any(dotted == gone or dotted.startswith(gone + ".") for gone, _ in left_out), (name, dotted)


def test_refusals_are_one_line(checkpoint: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path) -> None:
    source, _ = checkpoint
    (tmp_path / "there.safetensors").write_bytes(b"x")
    cases = {("convert", source, tmp_path / "there.safetensors"): f"{tmp_path / 'there.safetensors'}: already exists",
             ("convert", source, tmp_path / "out.bin"):
                 f"{tmp_path / 'out.bin'}: the suffix .bin does not say the format: name it .pt, .safetensors or "
                 ".npz, end it in / for a directory of .npy files, or give --to (pt, safetensors, npz, dir)",
             ("convert", "--to", "npz", source, f"{tmp_path / 'o'}/"):
                 f"{tmp_path / 'o'}/: ends in /, a directory, but --to npz writes a file"}
    for args, message in cases.items():
        done = run(*args)
        assert (done.returncode, done.stderr) == (1, f"ckptfs: {message}\n")


def _small_file_limit() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit then fail with EFBIG, as on a full disk
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))


@pytest.mark.parametrize("to", ["safetensors", "npz", "dir"])
def test_a_failed_write_is_one_line_and_leaves_nothing(checkpoint: tuple[Path, dict[str, torch.Tensor]],
                                                        tmp_path: Path, to: str) -> None:
    source, _ = checkpoint
    out = tmp_path / "out"
    done = run("convert", "--to", to, source, out, preexec_fn=_small_file_limit)
    assert done.returncode == 1 and done.stderr.startswith(f"ckptfs: {out}") and done.stderr.count("\n") == 1
    assert "File too large" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck.pt"]


def test_ctrl_c_leaves_nothing(checkpoint: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path,
                               monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    source, _ = checkpoint
    writes = ckptfs.cli.convert.write_pieces

    def interrupted(stream: Any, *args: Any) -> None:
        writes(stream, *args)
        raise KeyboardInterrupt

    monkeypatch.setattr(ckptfs.cli.convert, "write_pieces", interrupted)
    for to in ("safetensors", "dir"):
        assert main(["convert", "--to", to, str(source), str(tmp_path / "out")]) == INTERRUPTED
        assert capsys.readouterr().err == "ckptfs: interrupted\n"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["ck.pt"]


@pytest.mark.parametrize("to", ["pt", "safetensors", "npz", "dir"])
def test_ctrl_c_once_the_output_is_complete_ends_as_done(checkpoint: tuple[Path, dict[str, torch.Tensor]],
                                                         tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str], to: str) -> None:
    """SIGINT once the output's bytes are written, before it gets its name: the command completes (status 0, the
    output whole), never "interrupted" with the output left behind."""
    source, _ = checkpoint
    out = tmp_path / "out"
    ignore, replace = ckptfs.cli.convert.ignore_interrupts, os.replace
    steps = []

    def ignored_then_interrupted() -> None:
        ignore()
        steps.append("ignoring")
        os.kill(os.getpid(), signal.SIGINT)

    def replaced(src: Any, dst: Any) -> None:
        steps.append("renaming")
        replace(src, dst)

    monkeypatch.setattr(ckptfs.cli.convert, "ignore_interrupts", ignored_then_interrupted)
    monkeypatch.setattr(os, "replace", replaced)
    before = signal.getsignal(signal.SIGINT)
    try:
        assert main(["convert", "--to", to, str(source), str(out)]) == 0
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
    assert steps == (["ignoring"] if to == "dir" else ["ignoring", "renaming"])
    assert capsys.readouterr().err == ""
    monkeypatch.undo()
    expected = tmp_path / "again" / "out"  # the same name: a .pt's records are named after it
    expected.parent.mkdir()
    assert main(["convert", "--to", to, str(source), str(expected)]) == 0
    assert _contents(out) == _contents(expected)


def _contents(path: Path) -> dict[str, bytes]:
    if path.is_dir():
        return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}
    return {"": path.read_bytes()}


def test_every_way_of_copying_writes_the_same_bytes(checkpoint: tuple[Path, dict[str, torch.Tensor]],
                                                    tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """copy_file_range refuses two file systems (EXDEV): then sendfile, and where that fails too, through memory;
    a way that fails is given up for the rest of the file, and the output is the same whichever copied it."""
    source, _ = checkpoint
    assert main(["convert", str(source), str(tmp_path / "kernel.safetensors")]) == 0
    expected = (tmp_path / "kernel.safetensors").read_bytes()
    calls: dict[str, int] = {"copy_file_range": 0, "sendfile": 0}

    def refused(name: str) -> Any:
        def copy(*args: int) -> int:
            calls[name] += 1
            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))
        return copy

    sendfile = ckptfs.saving.output._sendfile
    sent: list[int] = []

    def counted(*args: int) -> int:
        sent.append(sendfile(*args))
        return sent[-1]

    monkeypatch.setattr(ckptfs.saving.output, "_copy_file_range", refused("copy_file_range"))
    monkeypatch.setattr(ckptfs.saving.output, "_sendfile", counted)
    assert main(["convert", str(source), str(tmp_path / "sendfile.safetensors")]) == 0
    assert calls == {"copy_file_range": 1, "sendfile": 0} and len(sent) > 1
    assert 0 < sum(sent) < len(expected)  # the stored ranges; the header went through memory
    assert (tmp_path / "sendfile.safetensors").read_bytes() == expected
    monkeypatch.setattr(ckptfs.saving.output, "_sendfile", refused("sendfile"))
    assert main(["convert", str(source), str(tmp_path / "memory.safetensors")]) == 0
    assert calls == {"copy_file_range": 2, "sendfile": 1}
    assert (tmp_path / "memory.safetensors").read_bytes() == expected


def test_progress_text() -> None:
    copied = Copied(3 << 20)
    copied.done = 1 << 20
    assert copy_status(copied) == "writing: 33% (1.0 MiB of 3.0 MiB)"
