"""``model.safetensors`` headers against the safetensors spec and library, and what they leave out."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
import safetensors.torch
import torch
from corpus import CORPUS_NAMES, CorpusFile, save_zip, torch_bytes

import ckptfs
from ckptfs.checkpoint import Checkpoint
from ckptfs.errors import LimitExceededError
from ckptfs.fs.layout import Layout
from ckptfs.fs.nodes import Kind
from ckptfs.fs.pieces import SourceBytes, TensorBytes, piece_bytes
from ckptfs.fs import safetensors as safetensors_view
from ckptfs.fs.safetensors import Tree as MemberTree
from ckptfs.fs.safetensors import DTYPE_NAMES, LeftOut, Members, SafetensorsFile, key_name, members
from ckptfs.limits import Limits
from ckptfs.model import jsontext
from ckptfs.model.dtypes import DTYPES
from ckptfs.model.encoding import has_surrogates
from ckptfs.model.records import Storage, Tensor, contiguous_strides
from ckptfs.model.tree import children
from ckptfs.pickle.values import Global, PickledObject


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
            SafetensorsFile(Members([], []), [LeftOut("k" * 300, "why")], ck.path, 200)


def test_names_and_paths_that_are_not_utf8_still_make_a_json_header() -> None:
    """Undecodable bytes of a key or path (kept as surrogates) are escaped, never an exception (found by the fuzzer)."""
    made = SafetensorsFile(Members([], []), [LeftOut("w\udc8c", "name not UTF-8")], "/data/m\udcff.pt", 1 << 20)
    (length,) = struct.unpack("<Q", made.header[:8])
    metadata = json.loads(made.header[8 : 8 + length])["__metadata__"]
    assert metadata["source"] == "/data/m\ufffd.pt"
    assert json.loads(metadata["left_out"]) == [["w\udc8c", "name not UTF-8"]]
    assert made.size == len(made.header)


def _reference_header(members: list[tuple[str, Tensor]], left_out: list[LeftOut], source: str) -> bytes:
    """The header as ``json.dumps`` of one dict gives it, padded as the spec says: what the arithmetic must match."""
    left = json.dumps([list(item) for item in left_out],
                      ensure_ascii=not all(not has_surrogates(item.name) for item in left_out))
    header: dict[str, Any] = {"__metadata__": {"format": "pt", "source": source, "left_out": left}}
    offset = 0
    for name, tensor in sorted(members, key=lambda member: -member[1].itemsize):
        shape = list(tensor.shape)
        if tensor.dtype.name == "float4_e2m1fn_x2":
            shape[-1] *= 2
        header[name] = {"dtype": DTYPE_NAMES[tensor.dtype.name], "shape": shape,
                        "data_offsets": [offset, offset + tensor.nbytes]}
        offset += tensor.nbytes
    text = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def _record(dtype: str, shape: tuple[int, ...]) -> Tensor:
    return Tensor(DTYPES[dtype], shape, contiguous_strides(shape), 0, Storage("0", DTYPES[dtype], "cpu", 0))


_names = st.text(st.characters(exclude_categories=("Cs",)), max_size=12) | st.sampled_from(
    ['"', "\\", "a\nb", "\x00\x1f\x7f", "é", "日本", "\U0001f600", "\u2028", "x" * 40])
_dims = st.lists(st.integers(0, 1 << 40) | st.integers(0, 12), max_size=4).map(tuple)


@settings(max_examples=200, deadline=None)
@given(members=st.lists(st.tuples(_names, st.sampled_from(sorted(DTYPE_NAMES) + ["float4_e2m1fn_x2"]), _dims),
                        max_size=30, unique_by=lambda member: member[0]),
       left_out=st.lists(st.tuples(_names, st.sampled_from(["quantized", "no data"])), max_size=3),
       source=_names, counted=st.sampled_from([1, 2, 5, jsontext.TEXT_CHUNK]))
def test_header_length_is_computed_without_the_header(members: list[tuple[str, str, tuple[int, ...]]],
                                                       left_out: list[tuple[str, str]], source: str,
                                                       counted: int) -> None:
    """The size (a listing's) is arithmetic on the members; the header made when read is exactly that long and is
    what ``json.dumps`` of the header's dict gives, for any names (quotes, escapes, control characters, unicode),
    dtypes, shapes (empty tensors, offsets of any length), however many members are counted at a time."""
    found = [(name, _record(dtype, shape)) for name, dtype, shape in members
             if name != "__metadata__" and (shape or dtype != "float4_e2m1fn_x2")]  # as ``members`` leaves out
    left = [LeftOut(*item) for item in left_out]
    with mock.patch.object(jsontext, "TEXT_CHUNK", counted):
        made = SafetensorsFile(Members([n for n, _ in found], [t for _, t in found]), left, source, 1 << 30)
    data_length = sum(tensor.nbytes for _, tensor in found)
    assert made.size == made.header_length + data_length
    assert made._header is None  # noqa: SLF001 - the listing's size must not have made it
    expected = _reference_header(found, left, source)
    assert made.header == expected and len(made.header) == made.header_length


def test_header_length_with_offsets_beyond_int64() -> None:
    """Hostile shapes can give offsets past 2**63: counted with Python ints, exactly."""
    found = [(f"t{n}", _record("float64", (1 << 31, 1 << 31, 1 << 2))) for n in range(3)]
    made = SafetensorsFile(Members([n for n, _ in found], [t for _, t in found]), [], "s", 1 << 20)
    assert made.header == _reference_header(found, [], "s")
    assert len(made.header) == made.header_length and made.size == made.header_length + 3 * (1 << 67)


@pytest.mark.parametrize("name", CORPUS_NAMES)
def test_corpus_sizes_are_the_bytes_made(corpus: dict[str, CorpusFile], name: str) -> None:
    with ckptfs.open(corpus[name].path) as ck:
        layout = Layout(ck)
        for path in layout.safetensors_paths():
            node = layout.lookup("/" + path)
            assert node is not None
            size = layout.size(node)
            made = layout.safetensors(node)
            assert made._header is None  # noqa: SLF001
            assert size == made.size == sum(len(piece_bytes(piece, ck.read)) for piece in made.pieces(ck.extents))


_KEYS = st.sampled_from(["a", "b", "a.b", "b.a", "__metadata__", "é", "w\udc8c", "x", "m.l.0.w", "m.l.1.w", "m.n.w",
                         "m.l.0", "a.b.c"])
_LEAVES = st.sampled_from(["f32", "f16", "c128", "meta", "q"])


def _leaf(kind: str) -> torch.Tensor:
    if kind == "q":
        return torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8)
    if kind == "meta":
        return torch.empty(2, device="meta")
    return torch.ones(3, dtype={"f32": torch.float32, "f16": torch.float16, "c128": torch.complex128}[kind])


_TREES = st.recursive(_LEAVES.map(_leaf), lambda inner: st.dictionaries(_KEYS, inner, max_size=4), max_leaves=12)


@settings(max_examples=60, deadline=None)
@given(tree=st.dictionaries(_KEYS, _TREES, min_size=1, max_size=5))
@example(tree={"a.b": _leaf("f32"), "a": {"b": _leaf("f16"), "x": _leaf("f32")}})
@example(tree={"a": {"b": _leaf("f32")}, "x": {"a.b": _leaf("f16")}})
@example(tree={"m.l.0.w": _leaf("f32"), "m.n.w": _leaf("f16"), "m.l.1.w": _leaf("f32"), "a.b.c": _leaf("f16")})
@example(tree={"m.l.0.w": _leaf("f32"), "m": {"l.0.w": _leaf("f16")}, "m.l.1.w": _leaf("q")})
@pytest.mark.parametrize("nest", [False, True])
def test_containers_of_tensors_only_give_the_members_a_child_at_a_time_gives(
        tree: dict[str, Any], nest: bool, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The check of a whole container at once (``_all_members``, here for any container; with ``--nest``, a dict's
    directories' tensors at once: ``_group_leaves``) against the walk a child at a time: the same names, tensors and
    what is left out, whatever the names met twice, the dtypes and the tensors without data."""
    path = save_zip(tree, tmp_path_factory.mktemp("members") / "t.pt")
    with ckptfs.open(path) as ck, pytest.MonkeyPatch.context() as bulk:
        bulk.setattr("ckptfs.fs.safetensors.BULK_MEMBERS", 1)
        layout = Layout(ck, nest=nest)
        bundles = [layout.lookup(where) for where in layout.safetensors_paths()]
        made = [layout.safetensors(node) for node in bundles]  # type: ignore[arg-type]
        with pytest.MonkeyPatch.context() as patched:
            patched.setattr("ckptfs.fs.safetensors._all_members", lambda *args: False)
            patched.setattr("ckptfs.fs.safetensors._group_leaves", lambda *args: None)
            again = Layout(ck, nest=nest)  # --nest's directories are the layout's own
            walked = [again.safetensors(again.lookup(where)) for where in layout.safetensors_paths()]  # type: ignore
        for fast, slow in zip(made, walked):
            assert (fast.names, fast.header, fast.size) == (slow.names, slow.header, slow.size)
            assert [id(tensor) for tensor in fast.tensors] == [id(tensor) for tensor in slow.tensors]


@pytest.mark.parametrize("bulk", [1, 1 << 20])
def test_a_key_met_twice_in_one_container_is_left_out_the_second_time(bulk: int) -> None:
    """An object's items may repeat a key (a pickle's ``SETITEMS`` on an object of an unknown class): the second is
    left out as met twice, whether the container is checked whole or a child at a time."""
    tensors = [_record("float32", (2,)) for _ in range(70)]
    items = [(f"w{n}", tensor) for n, tensor in enumerate(tensors[:-1])] + [("w3", tensors[-1])]
    top = {"layer": PickledObject(Global("m", "Layer"), dict_items=items)}
    tree = MemberTree(lambda value: list(children(value)), lambda *_: True)
    with mock.patch.object(safetensors_view, "BULK_MEMBERS", bulk):
        found, left_out = members(top, tree)
    assert found.names == [f"layer.w{n}" for n in range(69)]
    assert [id(tensor) for tensor in found.tensors] == [id(tensor) for tensor in tensors[:-1]]
    assert left_out == [LeftOut("layer.w3", "name met twice")]


def test_a_name_met_after_a_whole_container_took_it_is_left_out() -> None:
    """A container taken whole (its names checked at once) and a later container walked a child at a time whose
    child's name is one of them: the later one is left out as met twice."""
    whole = {f"b{n}": _record("float32", (2,)) for n in range(70)}
    later = _record("float16", (1,))
    top = {"x": {"a": whole}, "x.a": {"b0": later}}
    tree = MemberTree(lambda value: list(children(value)), lambda *_: True)
    found, left_out = members(top, tree)
    assert found.names == [f"x.a.b{n}" for n in range(70)]
    assert left_out == [LeftOut("x.a.b0", "name met twice")]
