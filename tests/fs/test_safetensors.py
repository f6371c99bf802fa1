"""``model.safetensors`` headers against the safetensors spec and library, and what they leave out."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch
from corpus import save_zip, torch_bytes

import ckptfs
from ckptfs.checkpoint import Checkpoint
from ckptfs.errors import LimitExceededError
from ckptfs.fs.layout import Layout
from ckptfs.fs.nodes import Kind
from ckptfs.fs.pieces import SourceBytes, TensorBytes, piece_bytes
from ckptfs.fs.safetensors import DTYPE_NAMES, LeftOut, SafetensorsFile, key_name
from ckptfs.limits import Limits


def whole(layout: Layout, ck: Checkpoint, path: str) -> bytes:
    node = layout.lookup(path)
    assert node is not None and node.kind is Kind.BUNDLE
    data = b"".join(piece_bytes(piece, ck.read) for piece in layout.pieces(node))
    assert len(data) == layout.size(node)
    return data


def header_of(data: bytes) -> dict[str, Any]:
    (length,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + length])


def test_every_safetensors_dtype_name_is_torchs() -> None:
    """The names are those safetensors itself writes for each torch dtype."""
    for name, st_name in DTYPE_NAMES.items():
        dtype = getattr(torch, name)
        written = safetensors.torch.save({"x": torch.zeros(2, 16, dtype=torch.uint8).view(dtype)})
        assert header_of(written)["x"]["dtype"] == st_name, name


def test_header_layout(tmp_path: Path) -> None:
    base = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    state = {"b": torch.ones(3, dtype=torch.int8), "w": base, "wt": base.t(), "h": torch.ones(5, dtype=torch.float16),
             "f4": torch.arange(6, dtype=torch.uint8).reshape(2, 3).view(torch.float4_e2m1fn_x2),
             "s": torch.tensor(1.5), "e": torch.empty(0, 4)}
    path = save_zip(state, tmp_path / "t.pt")
    with ckptfs.open(path) as ck:
        layout = Layout(ck)
        data = whole(layout, ck, "/model.safetensors")
        header = header_of(data)
        (length,) = struct.unpack("<Q", data[:8])
        assert (8 + length) % 8 == 0 and data[8 + length - 1 : 8 + length] in (b" ", b"}")
        assert list(header)[0] == "__metadata__"
        spans = sorted(entry["data_offsets"] for key, entry in header.items() if key != "__metadata__")
        assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
        assert spans[-1][1] == len(data) - 8 - length
        for key, entry in header.items():
            if key != "__metadata__":
                start = entry["data_offsets"][0]
                assert start % state[key].element_size() == 0, key
                assert data[8 + length + start : 8 + length + entry["data_offsets"][1]] == torch_bytes(state[key])
        assert header["f4"]["shape"] == [2, 6] and header["s"]["shape"] == []
        assert [key for key in header][1:3] == ["w", "wt"]  # largest elements first, tree order among equals
        (tmp_path / "copy.safetensors").write_bytes(data)
        loaded = safetensors.torch.load_file(tmp_path / "copy.safetensors")  # load(bytes) has no F4
        assert all(torch.equal(loaded[k].view(torch.uint8), state[k].contiguous().view(torch.uint8)) for k in state
                   if state[k].dtype == torch.float4_e2m1fn_x2)
        assert all(torch.equal(loaded[k], state[k]) for k in state if state[k].dtype != torch.float4_e2m1fn_x2)
        pieces = layout.pieces(layout.lookup("/model.safetensors"))  # type: ignore[arg-type]
        kinds = [type(piece) for piece in pieces[1:]]
        assert kinds.count(TensorBytes) == 1 and kinds.count(SourceBytes) == 5  # wt is gathered; e has no bytes


def test_left_out_and_names(tmp_path: Path) -> None:
    shared = {"x": torch.ones(2)}
    state = {"q": torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8), "c": torch.ones(2, dtype=torch.complex128),
             "meta": torch.empty(2, device="meta"), "sp": torch.ones(2, 2).to_sparse(), "a": shared, "again": shared,
             7: {(1, 2): torch.zeros(1)}, "a.x": torch.ones(1), "f4": torch.zeros((), dtype=torch.uint8).view(
                 torch.float4_e2m1fn_x2)}
    path = save_zip({"model": state}, tmp_path / "t.pt")
    with ckptfs.open(path) as ck:
        layout = Layout(ck)
        for where, prefix in (("/model.safetensors", "model."), ("/model/model.safetensors", "")):
            header = header_of(whole(layout, ck, where))
            left_out = dict(json.loads(header["__metadata__"]["left_out"]))
            assert left_out == {prefix + "q": "quantized", prefix + "c": "dtype complex128", prefix + "meta": "no data",
                                prefix + "sp": "sparse",
                                prefix + "again": "a container met before: its tensors are at its first path",
                                prefix + "a.x": "name met twice",
                                prefix + "f4": "a 0-d float4_e2m1fn_x2 has no safetensors shape"}
            assert set(header) == {"__metadata__", prefix + "a.x", prefix + "7.{\"$tuple\": [1, 2]}"}
            assert header["__metadata__"]["source"] == str(path) and header["__metadata__"]["format"] == "pt"
    assert key_name((1, 2)) == "{\"$tuple\": [1, 2]}" and key_name(-3) == "-3"


def test_header_over_the_limit(tmp_path: Path) -> None:
    path = save_zip({"k" * 300: torch.ones(1)}, tmp_path / "t.pt")
    with ckptfs.open(path, limits=Limits(max_generated_bytes=200)) as ck:
        with pytest.raises(LimitExceededError, match="model.safetensors's header would exceed 200 bytes"):
            SafetensorsFile([], [LeftOut("k" * 300, "why")], ck.path, 200)


def test_names_and_paths_that_are_not_utf8_still_make_a_json_header() -> None:
    """Undecodable bytes of a key or path (kept as surrogates) are escaped, never an exception (found by the fuzzer)."""
    made = SafetensorsFile([], [LeftOut("w\udc8c", "name not UTF-8")], "/data/m\udcff.pt", 1 << 20)
    (length,) = struct.unpack("<Q", made.header[:8])
    metadata = json.loads(made.header[8 : 8 + length])["__metadata__"]
    assert metadata["source"] == "/data/m\ufffd.pt"
    assert json.loads(metadata["left_out"]) == [["w\udc8c", "name not UTF-8"]]
    assert made.size == len(made.header)
