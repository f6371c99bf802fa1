"""``ckptfs cat`` run as a user would: one tensor's bytes against torch's, by file or dotted key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from corpus import CorpusFile, torch_bytes

import ckptfs
from ckptfs.cli.listing import listed

CLI = [sys.executable, "-m", "ckptfs.cli"]


def cat(*args: str | Path, stdout: Any = subprocess.PIPE) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*CLI, "cat", *map(str, args)], stdout=stdout, stderr=subprocess.PIPE, timeout=60)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(15)
    embed = torch.randn(50, 8, generator=gen)
    state = {"embed.weight": embed, "layers.0.attn.weight": torch.randn(8, 8, generator=gen).t(),
             "layers.0.bias": torch.arange(8, dtype=torch.bfloat16), "lm_head.weight": embed}
    path = tmp_path_factory.mktemp("cat") / "model.pt"
    torch.save({"model": state, "step": 7}, path)
    return path, state


@pytest.mark.parametrize("name", ["r1_views_containers", "r2_every_dtype", "r7_big_endian"])
def test_a_tensor_of_each_dtype_by_its_ls_file_is_torchs_bytes(corpus: dict[str, CorpusFile], name: str) -> None:
    entry = corpus[name]
    with ckptfs.open(entry.path) as ck:
        rows = {(tensor.dtype, tensor.is_contiguous): (file, tensor.path)
                for file, tensor, *_ in reversed(listed(ck)) if tensor.has_data}
    for file, path in rows.values():
        result = cat(entry.path, file)
        assert (result.returncode, result.stderr) == (0, b""), file
        assert result.stdout == torch_bytes(entry.expected.tensors[path]), file


def test_a_dotted_key_and_a_tied_weight_name_their_tensor(model: tuple[Path, dict[str, torch.Tensor]]) -> None:
    path, state = model
    for key in ["model.embed.weight", "model.lm_head.weight", "model/lm_head.weight", "/model/embed.weight"]:
        assert cat(path, key).stdout == torch_bytes(state["embed.weight"]), key
    assert cat(path, "model.layers.0.attn.weight").stdout == torch_bytes(state["layers.0.attn.weight"])
    assert cat(path, "model.layers.0.bias").stdout == torch_bytes(state["layers.0.bias"])


def test_output_to_a_file(model: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path) -> None:
    path, state = model
    result = cat(path, "model.embed.weight", "-o", tmp_path / "out.bin")
    assert (result.returncode, result.stdout, result.stderr) == (0, b"", b"")
    assert (tmp_path / "out.bin").read_bytes() == torch_bytes(state["embed.weight"])


def test_an_unknown_key_lists_near_matches(model: tuple[Path, dict[str, torch.Tensor]]) -> None:
    path, _ = model
    result = cat(path, "model.embed.weights")
    assert result.returncode == 1
    assert result.stderr.decode() == (f"ckptfs: {path}: no tensor 'model.embed.weights'; nearest: "
                                      "model.embed.weight, model.lm_head.weight, model.layers.0.attn.weight\n")
    result = cat(path, "model/layers.0.bias/x")
    assert result.stderr.decode().startswith(f"ckptfs: {path}: no tensor 'model/layers.0.bias/x'; nearest: "
                                              "model/layers.0.bias")
    assert cat(path, "step").stderr.decode() == f"ckptfs: {path}: 'step' is a value, not a tensor\n"
    assert cat(path, "zzzz").stderr.decode() == f"ckptfs: {path}: no tensor 'zzzz'\n"


def test_a_key_naming_two_tensors_asks_for_a_file(tmp_path: Path) -> None:
    torch.save({"x": {"a.b": torch.ones(1), "a": {"b": torch.zeros(1)}}}, tmp_path / "m.pt")
    result = cat(tmp_path / "m.pt", "x.a.b")
    assert result.returncode == 1
    assert result.stderr.decode() == (f"ckptfs: {tmp_path}/m.pt: key 'x.a.b' names 2 tensors; give one's file: "
                                      "x/a.b, x/a/b\n")
    assert cat(tmp_path / "m.pt", "x/a.b").stdout == torch_bytes(torch.ones(1))


def test_npy_writes_the_mounts_npy_view(model: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path) -> None:
    path, state = model
    result = cat("--npy", path, "model.layers.0.attn.weight", "-o", tmp_path / "w.npy")
    assert result.returncode == 0, result.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "w.npy"), state["layers.0.attn.weight"].numpy())


def test_npy_of_a_tensor_without_data_is_refused(tmp_path: Path) -> None:
    torch.save({"m": torch.empty(3, device="meta")}, tmp_path / "meta.pt")
    result = cat("--npy", tmp_path / "meta.pt", "m", "-o", tmp_path / "m.npy")
    assert result.returncode == 1 and not (tmp_path / "m.npy").exists()
    assert result.stderr.decode() == f"ckptfs: {tmp_path / 'meta.pt'}: m (float32) has no .npy view\n"


def test_a_full_disk_and_a_closed_pipe(tmp_path: Path) -> None:
    torch.save({"big": torch.zeros(1 << 20)}, tmp_path / "big.pt")
    if os.path.exists("/dev/full"):
        with open("/dev/full", "wb") as full:
            result = cat(tmp_path / "big.pt", "big", stdout=full)
        assert (result.returncode, result.stderr) == (1, b"ckptfs: writing the output: No space left on device\n")
        result = cat(tmp_path / "big.pt", "big", "-o", "/dev/full")
        assert (result.returncode, result.stderr) == (1, b"ckptfs: /dev/full: No space left on device\n")
    process = subprocess.Popen([*CLI, "cat", str(tmp_path / "big.pt"), "big"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    assert process.stdout is not None and process.stderr is not None
    assert process.stdout.read(10) == bytes(10)
    process.stdout.close()
    assert process.wait(timeout=60) == 0
    assert process.stderr.read() == b""


def test_the_help_examples_work_on_the_example_checkpoint(tmp_path: Path) -> None:
    """Each ``ckptfs cat --help`` example, run on examples/tiny_model.pt, writes the bytes torch has for its key."""
    repo = Path(ckptfs.__file__).resolve().parents[1]
    model = repo / "examples" / "tiny_model.pt"
    state = torch.load(model, weights_only=True)["model"]
    help_text = subprocess.run([*CLI, "cat", "--help"], capture_output=True, text=True, timeout=60).stdout
    examples = [line.split("#")[0].split("|")[0].split() for line in help_text.splitlines()
                if line.startswith("  ckptfs cat ")]
    assert len(examples) == 4
    for argv in examples:
        argv = [str(model) if arg == "model.pt" else arg for arg in argv[2:]]
        out = tmp_path / "out.bin"
        if "-o" in argv:
            argv[argv.index("-o") + 1] = str(out)
        else:
            argv += ["-o", str(out)]
        result = subprocess.run([*CLI, "cat", *argv], capture_output=True, text=True, timeout=60)
        assert (result.returncode, result.stderr) == (0, ""), argv
        key = next(arg for arg in argv if arg.startswith("model")).removeprefix("model").strip("./")
        key = key.replace("/", ".") if key.count("/") else key
        expected = state[key].numpy()
        if "--npy" in argv:
            np.testing.assert_array_equal(np.load(out), expected)
        else:
            assert out.read_bytes() == expected.tobytes(), argv
        out.unlink()
