"""A per-channel quantized tensor's scales and zero points as files beside its integer data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from corpus import save_zip, torch_bytes

import ckptfs
from ckptfs.fs.index import make_index
from ckptfs.fs.layout import Layout
from ckptfs.fs.nodes import Kind, Node
from ckptfs.fs.pieces import Literal, Piece, SourceBytes, TensorBytes

pytestmark = [pytest.mark.filterwarnings("ignore:torch.quantize_per"),
              pytest.mark.filterwarnings("ignore:TypedStorage")]


def _read(ck: ckptfs.Checkpoint, pieces: list[Piece]) -> bytes:
    out = b""
    for piece in pieces:
        if isinstance(piece, Literal):
            out += piece.data
        elif isinstance(piece, SourceBytes):
            out += piece.extent.source.read(piece.extent.offset, piece.extent.length)
        else:
            assert isinstance(piece, TensorBytes)
            out += ck.read(piece.tensor, piece.offset, piece.length)
    return out


def _quantized() -> dict[str, object]:
    floats = torch.linspace(-3, 3, 24).reshape(4, 6)
    per_channel = torch.quantize_per_channel(floats, torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64),
                                             torch.tensor([0, 1, -2, 3]), 0, torch.qint8)
    return {"w": per_channel, "again": per_channel, "t": torch.quantize_per_tensor(floats, 0.1, 3, torch.quint8),
            "w.q_scales": 5}


def _node(layout: Layout, path: str) -> Node:
    node = layout.lookup(path)
    assert node is not None, path
    return node


def test_scales_and_zero_points_are_files_beside_the_integer_data(tmp_path: Path) -> None:
    path = save_zip(_quantized(), tmp_path / "q.pt")
    expected = torch.load(path)
    with ckptfs.open(path) as ck:
        layout = Layout(ck)
        names = [n.name for n in layout.listing(layout.root)]
        assert names == [".ckptfs", "w", "w.json", "w.npy", "w.q_scales", "w.q_zero_points", "again", "again.json",
                         "again.npy", "again.q_scales", "again.q_zero_points", "t", "t.json", "t.npy", "w%2Eq_scales",
                         "model.safetensors"]
        w = expected["w"]
        parts = ((".q_scales", w.q_per_channel_scales()), (".q_zero_points", w.q_per_channel_zero_points()))
        for suffix, values in parts:
            node = _node(layout, "/w" + suffix)
            assert node.kind is Kind.VIEW and layout.size(node) == len(torch_bytes(values))
            assert _read(ck, layout.pieces(node)) == torch_bytes(values)
            link = _node(layout, "/again" + suffix)
            assert link.kind is Kind.VIEW_LINK and layout.link_target(link) == "w" + suffix
        assert layout.sizes([_node(layout, "/w.q_scales"), _node(layout, "/w.q_zero_points")]) == [32, 32]
        index = json.loads(make_index(layout))
        (entry,) = [t for t in index["tensors"] if t["file"] == "w"]
        assert (entry["q_scales"], entry["q_zero_points"]) == ("w.q_scales", "w.q_zero_points")
        assert all("q_scales" not in t for t in index["tensors"] if t["file"] != "w")
        sidecar = json.loads(layout.content(_node(layout, "/w.json")))
        assert sidecar["quantization"]["axis"] == 0 and sidecar["quantization"]["scales"]["$tensor"]["shape"] == [4]


def test_float_qparams_scales_and_zero_points_are_float32(tmp_path: Path) -> None:
    weights = torch.linspace(-1, 1, 15).reshape(3, 5)
    quantized = torch.quantize_per_channel(weights, torch.tensor([0.01, 0.02, 0.03]), torch.tensor([0.5, 1.0, 1.5]),
                                           0, torch.quint8)
    path = save_zip({"e": quantized}, tmp_path / "e.pt")
    q = torch.load(path)["e"]
    assert q.qscheme() == torch.per_channel_affine_float_qparams
    with ckptfs.open(path) as ck:
        layout = Layout(ck)
        assert _read(ck, layout.pieces(_node(layout, "/e.q_scales"))) == torch_bytes(q.q_per_channel_scales())
        assert _read(ck, layout.pieces(_node(layout, "/e.q_zero_points"))) == \
            torch_bytes(q.q_per_channel_zero_points())
        assert json.loads(layout.content(_node(layout, "/e.json")))["quantization"]["scales"]["$tensor"]["dtype"] \
            == "float32"
