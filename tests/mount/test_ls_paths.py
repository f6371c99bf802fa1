"""``ckptfs ls`` names each tensor by its file in a real mount of the same checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from corpus import CORPUS_NAMES, CorpusFile, save_legacy, save_zip, torch_bytes
from hostile.containers import zip_checkpoint
from hostile.picklegen import EMPTY_DICT, MARK, SETITEMS, i, ints, lst, pickle, s, storage_pid, tensor_v2

from mount.helpers import CLI, Mounter, run_cli

pytestmark = pytest.mark.mount

AWKWARD_KEYS: list[object] = ["a/b", ".", "..", "", ".hidden", "w", "w.json", "7", 7, "x" * 300, "é/ü", "\n",
                              "model.safetensors", "100%", "%30", "a  b", "\x1b[31m", 2.5, None, True, (1, 2)]


def assert_ls_names_mounted_files(source: Path, mnt: Path) -> list[str]:
    """Every first column of ``ckptfs ls`` is a tensor file of the mount whose sidecar has the tensor's key path, or
    an alias (``b -> a``): a link in the mount to that tensor's file; the index counts the same."""
    text, as_json = run_cli("ls", source), run_cli("ls", "--json", source)
    assert (text.returncode, text.stderr, as_json.returncode, as_json.stderr) == (0, "", 0, "")
    every = [json.loads(line) for line in as_json.stdout.splitlines()]
    every_line = text.stdout.splitlines()
    assert len(every_line) == len(every)
    index = json.loads((mnt / ".ckptfs" / "index.json").read_text())
    aliases = [record for record in every if "alias_of" in record]
    assert index["alias_count"] == len(aliases)
    for alias, line in zip(every, every_line):
        if "alias_of" in alias:
            assert line.startswith(f"{alias['file']} -> {alias['alias_of']}  "), line
            assert (mnt / alias["file"]).is_symlink(), alias
            assert (mnt / alias["file"]).resolve() == (mnt / alias["alias_of"]).resolve(), alias
    records = [record for record in every if "alias_of" not in record]
    lines = [line for line, record in zip(every_line, every) if "alias_of" not in record]
    assert [record["file"] for record in records] == [t["file"] for t in index["tensors"]]
    for line, record in zip(lines, records):
        file = record["file"]
        assert line.startswith(file + "  ") and line[len(file) + 2 :].split()[0] == record["dtype"], line
        target = mnt / file
        assert target.is_file() and not target.is_symlink(), file
        assert target.stat().st_size == min(record["nbytes"], (1 << 63) - 1)
        sidecar = json.loads((mnt / (file + ".json")).read_text())
        assert sidecar["path"] == record["path"], file
        assert (sidecar["dtype"], sidecar["shape"], sidecar["nbytes"]) == (record["dtype"], record["shape"],
                                                                           record["nbytes"])
    return [record["file"] for record in records]


@pytest.mark.parametrize("name", CORPUS_NAMES)
def test_corpus(corpus: dict[str, CorpusFile], corpus_mounts: dict[str, Path], name: str) -> None:
    files = assert_ls_names_mounted_files(corpus[name].path, corpus_mounts[name])
    assert len(files) == corpus[name].expected.distinct


@pytest.mark.parametrize("save", [save_zip, save_legacy])
def test_one_tensor(tmp_path: Path, mounter: Mounter, save) -> None:
    t = torch.arange(6, dtype=torch.int16).reshape(2, 3)
    source = save(t, tmp_path / "one.pt")
    mnt = mounter(source)
    assert assert_ls_names_mounted_files(source, mnt) == ["%root"]
    assert (mnt / "%root").read_bytes() == torch_bytes(t)


@pytest.mark.parametrize("save", [save_zip, save_legacy])
def test_awkward_keys(tmp_path: Path, mounter: Mounter, save) -> None:
    """Escapes, reserved suffixes, int-like strings, non-str keys and a name long enough to be shortened."""
    tensors = {key: torch.full((2,), float(n)) for n, key in enumerate(AWKWARD_KEYS)}
    source = save({"keys": tensors, "deep": {"x" * 250: {"\x00": tensors["w"]}}}, tmp_path / "k.pt")
    mnt = mounter(source)
    files = assert_ls_names_mounted_files(source, mnt)
    assert len(files) == len(AWKWARD_KEYS)
    for file, t in zip(files, tensors.values()):
        assert (mnt / file).read_bytes() == torch_bytes(t)
    assert any("%~" in file for file in files)  # the 300-character key's name is shortened


def test_tied_tensors_are_one_tensor_and_aliases(tmp_path: Path, mounter: Mounter) -> None:
    """``ls``, ``info``, the mount and its index tell one story: 2 tensors, and 2 aliases that are links."""
    t = torch.arange(6.0).reshape(2, 3)
    source = save_zip({"a": t, "b": t, "c": {"d": t}, "tt": t.t()}, tmp_path / "tied.pt")
    mnt = mounter(source)
    assert assert_ls_names_mounted_files(source, mnt) == ["a", "tt"]
    assert run_cli("ls", source).stdout.splitlines() == ["a         float32  2x3  24 B", "b -> a    float32  2x3  24 B",
                                                         "c/d -> a  float32  2x3  24 B", "tt        float32  3x2  24 B"]
    info = run_cli("info", source).stdout
    assert "tensors:   2 (+2 aliases: other places of the same tensors)\n" in info
    assert "elements:  12 in 2 tensors\n" in info
    assert os.readlink(mnt / "b") == "a" and os.readlink(mnt / "c" / "d") == "../a"
    for name in ["a", "b", "c/d", "c.d"]:
        cat = subprocess.run([*CLI, "cat", str(source), name], capture_output=True, timeout=60)
        assert (cat.returncode, cat.stdout) == (0, torch_bytes(t)), name


def test_keys_that_give_one_name(tmp_path: Path, mounter: Mounter) -> None:
    """Two list keys ``[1]`` (only a hand-made pickle has them) give one name; the second is suffixed ``%#N``."""
    tensor = tensor_v2(storage_pid("FloatStorage", "0", 4), i(0), ints(2), ints(1))
    other = tensor_v2(storage_pid("FloatStorage", "0", 4), i(2), ints(2), ints(1))
    body = EMPTY_DICT + MARK + lst(i(1)) + tensor + lst(i(1)) + other + s("w") + tensor + SETITEMS
    source = tmp_path / "dup.pt"
    source.write_bytes(zip_checkpoint(pickle(body), {"0": torch.arange(4.0).numpy().tobytes()}))
    mnt = mounter(source)
    files = assert_ls_names_mounted_files(source, mnt)
    assert len(files) == 3 and any(file.endswith("%#1") for file in files)
    assert sorted(os.listdir(mnt)) == sorted([".ckptfs", "model.safetensors", *files,
                                                *(f + s for f in files for s in (".json", ".npy"))])
    second = next(file for file in files if file.endswith("%#1"))
    assert (mnt / second).read_bytes() == torch.arange(2.0, 4.0).numpy().tobytes()
