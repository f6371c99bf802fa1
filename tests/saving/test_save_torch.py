"""``ckptfs convert SRC OUT.pt`` / ``save_torch``: what ``torch.load`` reads back equals the source, from every
source form ckptfs reads; the archive is framed record by record as torch 2.13 frames its own."""

from __future__ import annotations

import fractions
import re
import shutil
import struct
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch
import torch.distributed.checkpoint as dcp
from big_endian import save_big_endian
from corpus import save_legacy, save_zip
from dcp_writers import raw_bytes, save, simulate_ranks, torch_view
from remote_servers import Nginx
from tar_writer import tar_checkpoint
from torch import nn
from torch.distributed.checkpoint import HuggingFaceStorageWriter

import ckptfs
import pt2_writer
from ckptfs import save_torch

CLI = [sys.executable, "-m", "ckptfs.cli"]


def convert(source: Path | str, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "convert", str(source), str(out)], capture_output=True, text=True)


def loaded(out: Path) -> tuple[Any, Any]:
    """``torch.load`` of the output, plainly and memory-mapped, both with ``weights_only=True``."""
    return torch.load(out, weights_only=True), torch.load(out, weights_only=True, mmap=True)


def assert_same(ours: Any, theirs: Any, strides: bool = True, path: tuple[Any, ...] = ()) -> None:
    """Equal trees: dicts (any dict class) by keys in order, lists and tuples by type, tensors by class, dtype,
    shape, requires_grad and bytes (and strides unless the source's were not kept), leaves by type and value."""
    if isinstance(theirs, torch.Tensor):
        assert isinstance(ours, torch.Tensor) and type(ours) is type(theirs), path
        assert (ours.dtype, ours.shape, ours.requires_grad) == (theirs.dtype, theirs.shape, theirs.requires_grad), path
        assert raw_bytes(ours) == raw_bytes(theirs), path
        if strides:
            assert ours.stride() == theirs.stride(), path
    elif isinstance(theirs, dict):
        assert isinstance(ours, dict) and list(ours) == list(theirs), path
        for key in theirs:
            assert_same(ours[key], theirs[key], strides, path + (key,))
    elif isinstance(theirs, (list, tuple)):
        assert type(ours) is type(theirs) and len(ours) == len(theirs), path
        for i, (a, b) in enumerate(zip(ours, theirs)):
            assert_same(a, b, strides, path + (i,))
    else:
        assert type(ours) is type(theirs) and ours == theirs, path


def assert_converts(source: Path | str, out: Path, expected: Any, strides: bool = True, stderr: str = "") -> None:
    done = convert(source, out)
    assert (done.returncode, done.stderr) == (0, stderr)
    for value in loaded(out):
        assert_same(value, expected, strides)
    assert sorted(p.name for p in out.parent.iterdir() if "partial" in p.name) == []


def _state() -> dict[str, Any]:
    gen = torch.Generator().manual_seed(26)
    emb = torch.randn(6, 4, generator=gen)
    linear = nn.Linear(4, 3)
    return {
        "emb": emb, "head": emb, "row": emb[2], "cols": emb[:, 1:3], "t": emb.t(),
        "lin": linear.state_dict(), "param": nn.Parameter(torch.randn(3, generator=gen)),
        "frozen": nn.Parameter(torch.ones(2), requires_grad=False), "grad": torch.zeros(2).requires_grad_(),
        "half": torch.randn(5, generator=gen).half(), "bf": torch.randn(3, generator=gen).bfloat16(),
        "u16": torch.arange(5).to(torch.uint16), "f8": torch.randn(4, generator=gen).to(torch.float8_e4m3fn),
        "c": torch.randn(2, dtype=torch.complex64, generator=gen), "b": torch.tensor([True, False]),
        "empty": torch.empty(0, 3), "scalar": torch.tensor(7, dtype=torch.int16),
        "meta": {"step": 3, "lr": 0.5, "name": "run", "done": False, "none": None, "raw": b"\x00\xff",
                 "big": 1 << 70, "neg": -(1 << 40), "dtype": torch.float16, "device": torch.device("cpu"),
                 "list": [1, (2, "x"), [], ()], 7: "int key", (1, "a"): "tuple key"},
    }


def test_torch_save_archive_converts_record_by_record_as_torch_writes(tmp_path: Path) -> None:
    """Same records in the same order, each aligned to 64 by the same FB extra, same flags, small records and
    storage bytes identical; only the pickle (its memo) and the serialization id differ."""
    state = _state()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    source = save_zip(state, tmp_path / "a" / "model.pt")
    out = tmp_path / "b" / "model.pt"
    assert_converts(source, out, state)
    with zipfile.ZipFile(source) as theirs, zipfile.ZipFile(out) as ours:
        assert ours.testzip() is None
        assert [i.filename for i in ours.infolist()] == [i.filename for i in theirs.infolist()]
        data = out.read_bytes()
        for a, b in zip(ours.infolist(), theirs.infolist()):
            assert (a.flag_bits, a.compress_type, a.create_version, a.extract_version, a.date_time) == \
                   (b.flag_bits, b.compress_type, b.create_version, b.extract_version, b.date_time), a.filename
            name_length, extra_length = struct.unpack("<HH", data[a.header_offset + 26:a.header_offset + 30])
            extra = data[a.header_offset + 30 + name_length:a.header_offset + 30 + name_length + extra_length]
            assert extra[:2] == b"FB" and extra[4:] == b"Z" * (extra_length - 4)
            assert (a.header_offset + 30 + name_length + extra_length) % 64 == 0
            if not a.filename.endswith(("data.pkl", "serialization_id")):
                assert ours.read(a) == theirs.read(b), a.filename
        assert len(ours.read("model/.data/serialization_id")) == 40
    tail = out.read_bytes()[-98:]
    assert tail[:4] == b"PK\x06\x06" and tail[56:60] == b"PK\x06\x07" and tail[76:80] == b"PK\x05\x06"


def test_ties_stay_tied_and_shared_objects_stay_shared(tmp_path: Path) -> None:
    state = _state()
    state["again"] = state["meta"]
    state["u16_view"] = state["u16"][1:].view(torch.float8_e5m2)  # through an untyped storage (rebuild v3)
    source = save_zip(state, tmp_path / "ck.pt")
    out = tmp_path / "out.pt"
    assert convert(source, out).returncode == 0
    for value in loaded(out):
        assert value["head"] is value["emb"] and value["again"] is value["meta"]
        pointer = value["emb"].untyped_storage().data_ptr()
        assert all(value[k].untyped_storage().data_ptr() == pointer for k in ("row", "cols", "t"))
        assert value["row"].storage_offset() == 8
        assert value["u16_view"].untyped_storage().data_ptr() == value["u16"].untyped_storage().data_ptr()
        assert (value["u16_view"].storage_offset(), value["u16_view"].stride()) == (2, (1,))
    with zipfile.ZipFile(out) as archive:
        storages = [n for n in archive.namelist() if "/data/" in n]
    with zipfile.ZipFile(source) as archive:
        assert len(storages) == len([n for n in archive.namelist() if "/data/" in n])


def test_objects_torch_cannot_load_are_left_out_and_listed(tmp_path: Path) -> None:
    state = {"w": torch.ones(2), "frac": fractions.Fraction(1, 3), "items": [1, fractions.Fraction(2, 3), 3],
             "q": torch.quantize_per_tensor(torch.ones(2), 0.5, 0, torch.quint8), "set": {1, 2},
             "nested": {"keep": 1, "obj": fractions.Fraction(1, 2)}}
    source = save_zip(state, tmp_path / "ck.pt")
    out = tmp_path / "out.pt"
    expected = {"w": state["w"], "items": [1, None, 3], "nested": {"keep": 1}}
    listed = [f"ckptfs: {out}: left out {name}: {reason}\n" for name, reason in (
        ("frac", "an object of fractions.Fraction"), ("q", "a quantized tensor"), ("set", "a set"),
        ("items.1", "an object of fractions.Fraction"), ("nested.obj", "an object of fractions.Fraction"))]
    assert_converts(source, out, expected, stderr="".join(listed))
    with ckptfs.open(source) as ck:
        assert [name for name, _ in save_torch(ck, tmp_path / "api.pt")] == [
            "frac", "q", "set", "items.1", "nested.obj"]
    assert_same(torch.load(tmp_path / "api.pt", weights_only=True), expected)


@pytest.mark.parametrize("form", ["deflated", "big_endian", "legacy", "tar"])
def test_other_torch_save_forms(tmp_path: Path, form: str) -> None:
    state = {k: v for k, v in _state().items() if k not in ("meta", "lin", "u16", "f8")}
    source = tmp_path / "src.pt"
    if form == "deflated":
        stored = save_zip(state, tmp_path / "stored.pt")
        with zipfile.ZipFile(stored) as zin, zipfile.ZipFile(source, "w", zipfile.ZIP_DEFLATED) as zout:
            for name in zin.namelist():
                zout.writestr(name, zin.read(name))
    elif form == "big_endian":
        state = {k: v.detach() for k, v in state.items() if k not in ("param", "frozen", "grad")}
        save_big_endian(state, source)
    elif form == "legacy":
        save_legacy(state, source)
    else:
        state = {"w": state["emb"], "wt": state["t"], "row": state["row"], "h": state["half"], "epoch": 3}
        source.write_bytes(tar_checkpoint(state))
    expected = torch.load(source, weights_only=False)
    assert_converts(source, tmp_path / "out.pt", expected)


def test_torchscript_is_left_out_as_the_object_it_is(tmp_path: Path) -> None:
    source = tmp_path / "script.pt"
    torch.jit.save(torch.jit.script(nn.Sequential(nn.Linear(3, 2))), source)
    out = tmp_path / "out.pt"
    done = convert(source, out)
    # torch names a class scripted again in one process ___torch_mangle_N.Sequential
    assert done.returncode == 0 and re.fullmatch(
        rf"ckptfs: {re.escape(str(out))}: left out the whole object: an object of "
        r"__torch__\.torch\.nn\.modules\.container\.(___torch_mangle_\d+\.)?Sequential\n", done.stderr), done.stderr
    assert torch.load(out, weights_only=True) is None


def _dcp_state() -> dict[str, Any]:
    gen = torch.Generator().manual_seed(5)
    return {"model": {"w": torch.randn(8, 6, generator=gen), "b": torch.randn(6, generator=gen).bfloat16(),
                      "cnt": torch.arange(10, dtype=torch.int64)}, "step": 4, "name": "x"}


@pytest.mark.parametrize("ranks", [1, 2])
def test_dcp_directory(tmp_path: Path, ranks: int) -> None:
    source = tmp_path / "dcp"
    if ranks == 1:
        save(_dcp_state(), source)
    else:
        simulate_ranks(_dcp_state(), {"model.w": (0, 2), "model.cnt": (0, 2), "model.b": (0, 2)}, source, world=2)
        assert sorted(p.name for p in source.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    expected = torch_view(source, tmp_path / "theirs.pt")
    assert_converts(source, tmp_path / "out.pt", expected)


def test_dcp_through_an_http_prefix_and_a_file_through_its_url(tmp_path: Path, nginx: Nginx) -> None:
    source = nginx.root / "dcp26"
    simulate_ranks(_dcp_state(), {"model.w": (1, 2)}, source, world=2)
    expected = torch_view(source, tmp_path / "theirs.pt")
    assert_converts(f"{nginx.url}/dcp26/", tmp_path / "out.pt", expected)
    state = _state()
    save_zip(state, nginx.root / "model26.pt")
    assert_converts(f"{nginx.url}/model26.pt", tmp_path / "from_url.pt", state)


def test_pt2(tmp_path: Path) -> None:
    source = pt2_writer.save(pt2_writer.exported(), tmp_path / "w.pt2")
    program = pt2_writer.load(source)
    out = tmp_path / "out.pt"
    done = convert(source, out)
    assert done.returncode == 0, done.stderr
    for value in loaded(out):
        weights = value["model"]["weights"]
        named = {**program.state_dict, **program.constants}
        assert set(weights) <= set(named) and weights
        for name, tensor in weights.items():
            assert tensor.dtype == named[name].dtype and raw_bytes(tensor) == raw_bytes(named[name]), name


def test_safetensors_file_and_hf_directory(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(9)
    state = {"emb": torch.randn(6, 4, generator=gen).bfloat16(), "lin.weight": torch.randn(3, 5, generator=gen),
             "cnt": torch.tensor([5, -7]), "flags": torch.tensor([True, False])}
    safetensors.torch.save_file(state, tmp_path / "one.safetensors")
    assert_converts(tmp_path / "one.safetensors", tmp_path / "one.pt", safetensors.torch.load_file(
        tmp_path / "one.safetensors"))
    directory = tmp_path / "hf"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, storage_writer=HuggingFaceStorageWriter(
            str(directory), fqn_to_index_mapping={"emb": 1, "lin.weight": 2, "cnt": 2, "flags": 1}), no_dist=True)
    expected = {}
    for part in sorted(directory.glob("*.safetensors")):
        expected.update(safetensors.torch.load_file(part))
    with ckptfs.open(directory) as ck:
        order = list(ck.root)
    assert_converts(directory, tmp_path / "hf.pt", {k: expected[k] for k in order})


def test_refuses_an_existing_output_and_writes_nothing_on_error(tmp_path: Path) -> None:
    source = save_zip({"w": torch.ones(3)}, tmp_path / "ck.pt")
    (tmp_path / "there.pt").write_bytes(b"x")
    done = convert(source, tmp_path / "there.pt")
    assert (done.returncode, done.stderr) == (1, f"ckptfs: {tmp_path / 'there.pt'}: already exists\n")
    shutil.rmtree(tmp_path / "missing", ignore_errors=True)
    done = convert(source, tmp_path / "missing" / "out.pt")
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "No such file or directory" in done.stderr
