"""The mounted tree without FUSE: names, shared objects, inode numbers, sidecars and the index."""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from corpus import CORPUS_NAMES, CorpusFile, save_zip, write_raw_archive
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from index_files import files_by_id
from shapes import dag_bomb

import ckptfs
import ckptfs.fs.layout
from ckptfs.fs.describe import tensor_metadata
from ckptfs.fs.files import value_bytes
from ckptfs.fs.index import make_index, sized_index
from ckptfs.fs.layout import Layout
from ckptfs.fs.names import (
    CONTROL_DIR,
    INDEX_NAME,
    MAX_NAME_BYTES,
    RESERVED_SUFFIXES,
    ROOT_VALUE_NAME,
    child_names,
    entry_name,
    key_of_name,
)
from ckptfs.fs.nodes import Dir, Kind, Node
from ckptfs.fs.places import Places
from ckptfs.fs.sidecar import SidecarMaker
from ckptfs.fs.views import SIDECAR_SUFFIX, VIEW_NAMES
from ckptfs.model import jsontext
from ckptfs.model.encoding import encode_key, encode_leaf
from ckptfs.model.records import NestedTensor, SparseTensor, Storage, Tensor
from ckptfs.model.tree import children
from ckptfs.pickle.values import PickledObject

_keys = st.one_of(
    st.text(), st.integers(), st.binary(max_size=8), st.booleans(), st.none(),
    st.floats(allow_nan=False), st.tuples(st.integers(), st.text(max_size=3)),
    st.text(alphabet="./%-0123456789jsonpy", max_size=12),
)


@given(_keys, st.booleans())
def test_names_are_legal_and_decode_to_their_key(key: Any, beside_int: bool) -> None:
    name = entry_name(key, beside_int=beside_int and type(key) is str)
    raw = name.encode("utf-8")
    assert 0 < len(raw) <= MAX_NAME_BYTES and len(raw + SIDECAR_SUFFIX.encode()) <= 255
    assert "/" not in name and "\0" not in name and not name.startswith(".")
    assert not name.endswith(RESERVED_SUFFIXES)
    assert not any(ord(c) < 0x20 or ord(c) == 0x7F for c in name)
    if "%~" not in name:
        assert key_of_name(name, int_key=type(key) is int) == encode_key(key)
        if beside_int and type(key) is str:  # escaped: a str whatever the container holds
            assert key_of_name(name, int_key=True) == key


def _decodes_in(names: list[str], keys: list[Any]) -> list[Any]:
    """Each name's key, knowing only which int keys its container has (what the index's ``key`` fields say)."""
    int_names = {str(k) for k in keys if type(k) is int}
    return [key_of_name(name, int_key=name.partition("%#")[0] in int_names) for name in names]


_int_like_keys = st.one_of(st.integers(-20, 20), st.integers(-20, 20).map(str),
                           st.sampled_from(["007", "-0", "+1", " 1", "1.0", "٣"]), _keys)


@given(st.lists(_int_like_keys, max_size=12))
@example(["0" * 26 + "\x1f0" * 80 + "\u0155"])  # long enough once escaped to be shortened (found on a fresh machine)
def test_keys_of_one_container_get_distinct_reversible_names(keys: list[Any]) -> None:
    distinct = list(dict.fromkeys(keys, None))
    distinct = [k for k in distinct if not (type(k) is bool and any(type(o) is int and o == k for o in distinct))]
    names = child_names(distinct)
    assert len(set(names)) == len(names)
    for name, key in zip(names, distinct):
        assert name == entry_name(key, beside_int=type(key) is str and key in {str(k) for k in distinct
                                                                             if type(k) is int})
    whole = [(name, key) for name, key in zip(names, distinct) if "%~" not in name]  # a shortened name has no key
    assert _decodes_in([name for name, _ in whole], distinct) == [encode_key(key) for _, key in whole]


_state_dict_keys = st.one_of(
    st.from_regex(r"[a-z_]{1,8}(\.[0-9a-z_]{1,12}){0,5}", fullmatch=True),
    st.text(st.characters(codec="utf-8"), min_size=55, max_size=300),
    st.sampled_from([".hidden", "w.json", "a.npy", "b.safetensors", "x.q_scales", "", "a/b", "a%b", "\x7f", "é",
                     "%", "-0", "7", "a" * 60, "a" * 61, "ä" * 61, "w.json.x"]))


@given(st.lists(_state_dict_keys, max_size=40, unique=True))
@example(["layer.0.weight", ".hidden"])
@example(["layer.0.weight", "w.json"])
@example(["layer.0.weight", "a/b"])
@example(["layer.0.weight", ""])
@example(["layer.0.weight", "ä" * 61, "a" * 61])
def test_str_keys_are_named_in_bulk_as_one_by_one(keys: list[str]) -> None:
    """A container of str keys only (a state dict) is named a column at a time, its text checked a chunk at a
    time: the names each key has alone."""
    expected = [entry_name(key) for key in keys]
    for checked in (1, 3, jsontext.TEXT_CHUNK):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(jsontext, "TEXT_CHUNK", checked)
            assert child_names(keys) == child_names(keys, distinct=True) == expected


def test_repeated_keys_get_a_position_suffix() -> None:
    assert child_names(["a", "7", 7, "a", 7, "7"]) == ["a", "%37", "7", "a%#3", "7%#4", "%37%#5"]
    assert _decodes_in(["a", "%37", "7", "a%#3", "7%#4", "%37%#5"], ["a", "7", 7]) == ["a", "7", 7, "a", 7, "7"]


@pytest.mark.parametrize("key, name", [
    ("weight", "weight"), (7, "7"), ("7", "7"), (-3, "-3"), ("-3", "-3"), ("007", "007"), ("a/b", "a%2Fb"),
    (".", "%2E"), ("..", "%2E."), (".hidden", "%2Ehidden"), ("", '%=""'), ("x\0y", "x%00y"),
    ("w.json", "w%2Ejson"), ("w.npy", "w%2Enpy"), ("model.safetensors", "model%2Esafetensors"),
    ("100%", "100%25"), ("é", "é"), ("\n", "%0A"), (True, "%=true"), (None, "%=null"), (1.5, "%=1.5"),
    ((1, "a"), '%={"$tuple":[1,"a"]}'), (b"\xff", '%={"$bytes":"/w=="}'.replace("/", "%2F")),
    (".json", "%2Ejson"), ("..json", "%2E%2Ejson"), ("7.npy", "7%2Enpy"), ("%.json", "%25%2Ejson"),
    ("/.npy", "%2F%2Enpy"), ("%7", "%257"), ("a/.json", "a%2F%2Ejson"),
])
def test_documented_names(key: Any, name: str) -> None:
    assert entry_name(key) == name


@pytest.mark.parametrize("keys, names", [
    (["0", "1", "training"], ["0", "1", "training"]),
    ([7, "7"], ["7", "%37"]),
    (["7", 7], ["%37", "7"]),
    (["-3", -3, "-0", 0, "007", 7], ["%2D3", "-3", "-0", "0", "007", "7"]),
    ([True, 1, "1"], ["%=true", "1", "%31"]),
    (["x" * 300 + "7", 10**300, str(10**300)], [entry_name("x" * 300 + "7"), entry_name(10**300),
                                               entry_name(str(10**300), beside_int=True)]),
])
def test_documented_directories(keys: list[Any], names: list[str]) -> None:
    assert child_names(keys) == names
    assert len(set(names)) == len(names)


def test_long_names_are_cut_and_hashed() -> None:
    a, b = "x" * 300 + "a", "x" * 300 + "b"
    assert entry_name(a) != entry_name(b)
    assert entry_name(a).startswith("x" * 200 + "%~") and len(entry_name(a)) == 218
    cut_in_escape = entry_name("y" * 199 + "/" * 50)
    assert cut_in_escape.startswith("y" * 199 + "%~")
    with pytest.raises(ValueError, match="index"):
        key_of_name(entry_name(a))


def test_value_files() -> None:
    assert value_bytes(3) == b"3\n"
    assert value_bytes(0.001) == b"0.001\n"
    assert value_bytes(math.inf) == b"inf\n"
    assert value_bytes(True) == b"True\n"
    assert value_bytes(None) == b"None\n"
    assert value_bytes("run/1") == b"run/1\n"
    assert value_bytes(b"\x00\xff") == b"\x00\xff"
    assert json.loads(value_bytes(1 + 2j)) == {"$complex": [1.0, 2.0]}


def _names(layout: Layout, directory: Dir) -> list[str]:
    return [n.name for n in layout.listing(directory)]


def test_tree_names_links_and_sidecars(tmp_path: Path) -> None:
    base = torch.arange(6.0).reshape(2, 3)
    shared = {"deep": base}
    path = save_zip({"a": shared, "b": shared, "w": base, "w.json": 1, 7: "int", "7": "str", "epoch": 3},
                    tmp_path / "t.pt")
    with ckptfs.open(path) as ck:
        layout = Layout(ck)
        assert _names(layout, layout.root) == [CONTROL_DIR, "a", "b", "w", "w.json", "w.npy", "w%2Ejson",
                                               "7", "%37", "epoch", "model.safetensors"]
        assert layout.content(layout.lookup("/7")) == b"int\n"  # type: ignore[arg-type]
        assert layout.content(layout.lookup("/%37")) == b"str\n"  # type: ignore[arg-type]
        b = layout.lookup("/b")
        assert b is not None and b.kind is Kind.LINK and layout.link_target(b) == "a"
        w = layout.lookup("/w")
        assert w is not None and w.kind is Kind.LINK and layout.link_target(w) == "a/deep"
        meta_link = layout.lookup("/w.json")
        assert meta_link is not None and layout.link_target(meta_link) == "a/deep.json"
        deep = layout.lookup("/a/deep")
        assert deep is not None and deep.kind is Kind.TENSOR and layout.size(deep) == 24
        sidecar = layout.lookup("/a/deep.json")
        assert sidecar is not None and json.loads(layout.content(sidecar)) == tensor_metadata(ck.tensors[0])
        assert layout.content(layout.lookup("/epoch")) == b"3\n"  # type: ignore[arg-type]
        assert layout.lookup("/a/deep/x") is None and layout.lookup("/nothing") is None


def test_inode_numbers_are_unique_and_stable(tmp_path: Path) -> None:
    path = save_zip({"m": {"w": torch.ones(2), "l": [torch.zeros(1), 3]}, "x": "y"}, tmp_path / "t.pt")

    def inodes() -> dict[str, int]:
        with ckptfs.open(path) as ck:
            layout = Layout(ck)
            found: dict[str, int] = {}
            stack: list[Node] = [layout.root]
            while stack:
                node = stack.pop()
                found[layout.path_of(node)] = node.ino
                if isinstance(node, Dir):
                    stack.extend(reversed(layout.listing(node)))
            return found

    first = inodes()
    assert len(set(first.values())) == len(first)
    assert inodes() == first


def test_shared_reference_bomb_is_small(tmp_path: Path) -> None:
    path = write_raw_archive(tmp_path / "bomb.pt", dag_bomb(40), {"data/0": b"\0" * 8})
    with ckptfs.open(path) as ck:
        layout = Layout(ck)
        count, stack = 0, [layout.root]
        while stack:
            node = stack.pop()
            count += 1
            if isinstance(node, Dir):
                stack.extend(layout.listing(node))
        assert count < 100
        one = layout.lookup("/1")
        assert one is not None and one.kind is Kind.LINK and layout.link_target(one) == "0"
        deep = "/" + "/".join(["0"] * 40)
        tensor = layout.lookup(deep + "/0")
        assert tensor is not None and tensor.kind is Kind.TENSOR
        index = json.loads(layout.index_bytes())
        assert [t["file"] for t in index["tensors"]] == [deep[1:] + "/0"]


def test_lookup_resolves_deep_paths_with_a_bounded_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ckptfs.fs.layout, "DIR_CACHE_SIZE", 8)
    path = write_raw_archive(tmp_path / "deep.pt", b"\x80\x02" + b"]" * 30 + b"K\x07" + b"a" * 30 + b".")
    with ckptfs.open(path) as ck:
        layout = Layout(ck)
        for depth in [30, 1, 29, 5, 30]:
            node = layout.lookup("/" + "/".join(["0"] * depth))
            assert node is not None and layout.path_of(node) == "/".join(["0"] * depth)
            assert len(layout._dirs) <= 8
        leaf = "/" + "/".join(["0"] * 30)
        assert layout.content(layout.lookup(leaf)) == b"7\n"  # type: ignore[arg-type]
        assert layout.lookup(leaf + "/0") is None and layout.lookup(leaf + "/0/0") is None
        assert layout.lookup("/0/1") is None and layout.lookup("/0/1/0") is None


def test_cycle_links_to_an_ancestor(tmp_path: Path) -> None:
    # root = [inner, inner] with inner = [root]
    path = write_raw_archive(tmp_path / "cycle.pt", b"\x80\x02]q\x00(]q\x01h\x00ah\x01e.")
    with ckptfs.open(path) as ck:
        layout = Layout(ck)
        up = layout.lookup("/0/0")
        assert up is not None and up.kind is Kind.LINK and layout.link_target(up) == ".."
        again = layout.lookup("/1")
        assert again is not None and layout.link_target(again) == "0"
    path = write_raw_archive(tmp_path / "self.pt", b"\x80\x02]q\x00h\x00a.")
    with ckptfs.open(path) as ck:
        layout = Layout(ck)
        itself = layout.lookup("/0")
        assert itself is not None and layout.link_target(itself) == "."


def test_root_that_is_a_tensor(tmp_path: Path) -> None:
    path = save_zip(torch.arange(4, dtype=torch.int32), tmp_path / "t.pt")
    with ckptfs.open(path) as ck:
        layout = Layout(ck)
        assert _names(layout, layout.root) == [CONTROL_DIR, ROOT_VALUE_NAME, ROOT_VALUE_NAME + SIDECAR_SUFFIX,
                                                             ROOT_VALUE_NAME + ".npy", "model.safetensors"]
        index = json.loads(layout.index_bytes())
        assert index["tensors"] == [{"id": 1, "parent": 0, "path": [], "file": ROOT_VALUE_NAME,
                                     "sidecar": ROOT_VALUE_NAME + SIDECAR_SUFFIX, "npy": ROOT_VALUE_NAME + ".npy",
                                     "dtype": "int32", "shape": [4],
                                     "nbytes": 16}]
        assert index["entries"] == [{"id": 0, "name": "", "kind": "dir"}]


def _has_int_key(directory: Dir | None, name: str) -> bool:
    """Whether ``name`` may stand for an int key in ``directory``: what a reader of the index knows."""
    assert directory is not None
    return isinstance(directory.value, (list, tuple)) or any(type(k) is int and str(k) == name.partition("%#")[0]
                                                             for k, _ in children(directory.value))


def index_kind(container: Any) -> str:
    kinds = {dict: "dict", list: "list", tuple: "tuple", SparseTensor: "sparse", NestedTensor: "nested",
             PickledObject: "object"}
    return next(kind for cls, kind in kinds.items() if isinstance(container, cls))


@pytest.mark.parametrize("name", CORPUS_NAMES)
def test_index_lists_every_tensor_and_entry(corpus: dict[str, CorpusFile], name: str) -> None:
    with ckptfs.open(corpus[name].path) as ck:
        layout = Layout(ck)
        _check_index_size(layout)
        index = json.loads(layout.index_bytes())
        assert index["ckptfs_index"] == 3
        assert index["safetensors"][:1] == (["model.safetensors"] if ck.tensors else [])
        for path in index["safetensors"]:
            node = layout.lookup("/" + path)
            assert node is not None and node.kind is Kind.BUNDLE
        assert index["tensor_count"] == len(ck.tensors) == len(index["tensors"])
        files = files_by_id(index)
        assert sorted(files) == list(range(len(files)))
        for tensor, listed in zip(ck.tensors, index["tensors"]):
            assert listed["path"] == [encode_key(k) for k in tensor.path]
            node = layout.lookup("/" + listed["file"])
            assert node is not None and node.value is tensor and node.kind is Kind.TENSOR
            assert layout.lookup("/" + listed["sidecar"]) is not None
            npy = layout.lookup("/" + listed["npy"]) if "npy" in listed else None
            assert (npy is not None) == (json.loads(layout.content(layout.lookup("/" + listed["sidecar"])))["npy"]
                                         is not None)
        root = index["entries"][0]
        assert root["id"] == 0 and "parent" not in root and root["kind"] == index_kind(ck.root)
        for entry in index["entries"][1:]:
            node = layout.lookup("/" + files[entry["id"]])
            assert node is not None and node.name == entry["name"]
            assert entry["key"] == encode_key(node.key)
            if "%~" not in node.name:
                assert key_of_name(node.name, int_key=_has_int_key(node.parent, node.name)) == entry["key"]
            if entry["kind"] == "value":
                assert node.kind is Kind.VALUE and entry["size"] == len(value_bytes(node.value)) == layout.size(node)
                if entry["size"] <= 256:
                    assert entry["value"] == json.loads(json.dumps(encode_leaf(node.value)))
                else:
                    assert "value" not in entry
            elif entry["kind"] == "link":
                assert node.kind is Kind.LINK
                target = layout.lookup("/" + files[entry["target"]])
                assert target is not None and target.ino == layout.node_of(node.value).ino
            else:
                assert isinstance(node, Dir) and entry["kind"] == index_kind(node.value)
        assert layout.lookup(f"/{CONTROL_DIR}/{INDEX_NAME}") is not None


@pytest.mark.parametrize("name", CORPUS_NAMES)
def test_sidecars_are_tensor_metadata(corpus: dict[str, CorpusFile], name: str) -> None:
    with ckptfs.open(corpus[name].path) as ck:
        make = SidecarMaker()
        for tensor in ck.tensors * 2:
            assert make(tensor) == (json.dumps(tensor_metadata(tensor)) + "\n").encode()
            assert make.size(tensor) == len(make(tensor))


def test_sidecar_families_know_every_field() -> None:
    """SidecarMaker groups tensors by what their metadata holds: a new field must be placed in or out."""
    assert Tensor.FIELDS == (
        "dtype", "shape", "stride", "storage_offset", "storage", "requires_grad", "is_parameter", "kind",
        "conj", "neg", "quantization", "type_name", "trail", "chunks")
    assert Storage.FIELDS == (
        "key", "dtype", "location", "numel", "record", "offset", "size", "byteorder", "compressed", "written",
        "inline_data", "base", "base_offset", "source")


_awkward_keys = st.one_of(st.text(max_size=5), st.sampled_from(["", ".", "..", "a/b", "x.json", "7", ".h"]),
                          st.integers(-3, 20))
_shapes = st.recursive(
    st.sampled_from(["tensor", "shared", "leaf"]),
    lambda inner: st.lists(inner, max_size=3) | st.lists(inner, max_size=3).map(tuple)
    | st.dictionaries(_awkward_keys, inner, max_size=4),
    max_leaves=10,
)


def _materialize(shape: Any, shared: torch.Tensor, counter: list[int]) -> Any:
    if shape == "tensor":
        counter[0] += 1
        return torch.full((2,), float(counter[0]))
    if shape == "shared":
        return shared
    if shape == "leaf":
        return counter[0]
    if isinstance(shape, dict):
        return {k: _materialize(v, shared, counter) for k, v in shape.items()}
    return type(shape)(_materialize(v, shared, counter) for v in shape)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.dictionaries(_awkward_keys, _shapes, min_size=1, max_size=5))
def test_random_trees(tmp_path: Path, shape: dict[Any, Any]) -> None:
    obj = _materialize(shape, torch.arange(3), [0])
    with ckptfs.open(save_zip(obj, tmp_path / "random.pt")) as ck:
        layout = Layout(ck)
        inodes: set[int] = set()
        stack: list[Node] = [layout.root]
        while stack:
            node = stack.pop()
            assert node.ino not in inodes
            inodes.add(node.ino)
            if isinstance(node, Dir):
                names = [n.name for n in layout.listing(node)]
                assert len(set(names)) == len(names)
                stack.extend(layout.listing(node))
            elif node.kind in (Kind.LINK, Kind.VIEW_LINK):
                target = layout.link_target(node)
                assert node.parent is not None
                resolved = layout.lookup("/" + resolve(layout.path_of(node.parent), target))
                assert resolved is not None and resolved.kind in (Kind.DIR, Kind.TENSOR, Kind.VIEW)
        _check_index_size(layout)
        index = json.loads(layout.index_bytes())
        assert [t["path"] for t in index["tensors"]] == [[encode_key(k) for k in t.path] for t in ck.tensors]
        for listed, tensor in zip(index["tensors"], ck.tensors):
            node = layout.lookup("/" + listed["file"])
            assert node is not None and node.value is tensor


def _shown(layout: Layout) -> list[tuple[str, int, Kind, str | None]]:
    """Every entry below the root, views too: its path, number, kind, and a link's target."""
    found: list[tuple[str, int, Kind, str | None]] = []
    stack: list[Node] = [layout.root]
    while stack:
        node = stack.pop()
        target = layout.link_target(node) if node.kind in (Kind.LINK, Kind.VIEW_LINK) else None
        found.append((layout.path_of(node), node.ino, node.kind, target))
        if isinstance(node, Dir):
            stack.extend(layout.listing(node))
    return found


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.dictionaries(_awkward_keys, _shapes, min_size=1, max_size=5), nest=st.booleans())
@example(shape={f"w{n}": "tensor" for n in range(300)}, nest=False)  # a directory's children made in bulk
@example(shape={"x": "leaf", "m": {f"a.b{n}": "tensor" for n in range(300)}}, nest=True)
@example(shape={f"w{n}": "shared" if n % 7 == 0 else "tensor" for n in range(300)}, nest=False)
def test_tensors_met_once_are_placed_when_asked_for_as_when_walked(tmp_path: Path, shape: dict[Any, Any],
                                                                   nest: bool) -> None:
    """Where no tensor is met twice, their places are made only when asked for (``Places``' ``met_once``): the
    same entries, numbers, kinds, links and first places as when every place is made by the walk."""
    obj = _materialize(shape, torch.arange(3), [0])
    with ckptfs.open(save_zip(obj, tmp_path / "random.pt")) as ck:
        lazy = Layout(ck, nest=nest)
        assert lazy.places._met_once == (ck.alias_count == 0)  # noqa: SLF001
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("ckptfs.fs.layout.Places", lambda *args, **kw: Places(*args, **{**kw, "met_once": False}))
            walked = Layout(ck, nest=nest)
        assert _shown(lazy) == _shown(walked)
        for tensor in ck.tensors:
            assert lazy.places.first_place(tensor) == walked.places.first_place(tensor)
            assert lazy.path_of(lazy.node_of(tensor)) == walked.path_of(walked.node_of(tensor))
        for _, ino, _, _ in _shown(walked):
            found, expected = Layout(ck, nest=nest).node_at(ino), walked.node_at(ino)
            assert (found and (found.name, found.kind)) == (expected and (expected.name, expected.kind))


def _check_index_size(layout: Layout) -> None:
    """The index's size counted (kept up to a bound, or not at all) is its length, as a listing shows it."""
    index = make_index(layout)
    for bound in (0, len(index) // 2, len(index) - 1, len(index), 1 << 40):
        assert sized_index(layout, bound) == (len(index), index if len(index) <= bound else None), bound
    assert layout.size(layout.control.head[0]) == len(index)


_BIG_DIRECTORY_KEYS = ["w", "é", "a/b", '"q"', "x\\y", "\x01", "long" * 20, "7", ".h", "k.json", "日本"]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keys=st.lists(st.sampled_from(_BIG_DIRECTORY_KEYS), min_size=1, max_size=4),
       kinds=st.lists(st.sampled_from(["f32", "bf16", "meta", "empty", "q", "bool"]), min_size=1, max_size=4),
       nested=st.booleans(), views=st.sampled_from([VIEW_NAMES, frozenset(), frozenset({"npy"})]), nest=st.booleans())
@example(keys=["w"], kinds=["f32"], nested=False, views=VIEW_NAMES, nest=False)
@example(keys=["é"], kinds=["meta", "bf16"], nested=True, views=VIEW_NAMES, nest=True)
def test_an_index_of_big_directories_is_counted_as_it_is_made(tmp_path: Path, keys: list[str], kinds: list[str],
                                                                nested: bool, views: frozenset[str],
                                                                nest: bool) -> None:
    """Directories of tensors only (300 each, listed in bulk) have their index lines counted without being made
    (``_TensorLines.length``): the size is the made index's, whatever the names (escapes, UTF-8), dtypes, shapes,
    tensors without data, views shown, depth and --nest; a quantized tensor's directory is made line by line."""
    made = {"f32": lambda n: torch.full((n % 4 + 1,), 1.0),
            "bf16": lambda n: torch.zeros(2, n % 3, dtype=torch.bfloat16), "meta": lambda n: torch.empty(3, device="meta"), "empty": lambda n: torch.zeros(0),
            "q": lambda n: torch.quantize_per_tensor(torch.ones(2), 0.5, 1, torch.qint8),
            "bool": lambda n: torch.ones(n % 5, dtype=torch.bool)}
    tensors = {f"{keys[n % len(keys)]}.{n}": made[kinds[n % len(kinds)]](n) for n in range(300)}
    tree: dict[str, Any] = {"inner": {"deeper": tensors}, "v": 1} if nested else tensors
    with ckptfs.open(save_zip(tree, tmp_path / "big.pt")) as ck:
        _check_index_size(Layout(ck, views=views, nest=nest))


def resolve(base: str, relative: str) -> str:
    """``base/relative`` with ``..`` and ``.`` resolved, as the kernel follows a relative symlink."""
    parts = [] if base == "." else base.split("/")
    for part in relative.split("/"):
        if part == "..":
            parts.pop()
        elif part != ".":
            parts.append(part)
    return "/".join(parts)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keys=st.lists(_int_like_keys, min_size=1, max_size=10), tensors=st.lists(st.booleans(), min_size=10,
                                                                                 max_size=10))
@example(keys=[7, "7", "0", 0, "-3", "007"], tensors=[True, False] * 5)
def test_index_maps_every_name_back_to_its_key(tmp_path: Path, keys: list[Any], tensors: list[bool]) -> None:
    """In a mounted dict of awkward keys (ints, strs spelling ints, both), names are distinct and the index
    gives each name's exact key; a reader knowing the dict's int keys decodes each name to it too."""
    obj = {key: torch.full((1,), float(n)) if tensors[n] else n for n, key in enumerate(keys)}
    with ckptfs.open(save_zip(obj, tmp_path / "keys.pt")) as ck:
        layout = Layout(ck)
        names = [node.name for node in layout.children(layout.root)]
        assert len(set(names)) == len(names) == len(obj)
        index = json.loads(layout.index_bytes())
        keyed = [(e["name"], e["key"]) for e in index["entries"] if e.get("parent") == 0]
        keyed += [(t["file"], t["path"][-1]) for t in index["tensors"]]
        assert sorted(keyed, key=repr) == sorted(zip(names, [encode_key(k) for k in obj]), key=repr)
        int_names = {str(k) for k in obj if type(k) is int}
        for name, key in keyed:
            node = layout.lookup("/" + name)
            assert node is not None and encode_key(node.key) == key
            if "%~" not in name:
                assert key_of_name(name, int_key=name in int_names) == key


def test_tensors_places_are_made_once_for_threads_asking_together(tmp_path: Path) -> None:
    """A mount's threads may ask for tensors' places at once: one makes them, the others wait and find them all."""
    tensors = {f"w{n}": torch.zeros(1) for n in range(300)}
    with ckptfs.open(save_zip(tensors, tmp_path / "flat.pt")) as ck:
        places = Layout(ck).places
        making, release = threading.Event(), threading.Event()
        place = Places._place

        def held(self: Places, *args: Any) -> None:
            making.set()
            release.wait(30)
            place(self, *args)

        found: dict[str, Any] = {}

        def ask(name: str, tensor: Any) -> None:
            try:
                found[name] = places.first_place(tensor)
            except KeyError as exc:
                found[name] = exc

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(Places, "_place", held)
            first = threading.Thread(target=ask, args=("first", ck.tensors[0]))
            first.start()
            assert making.wait(30)
            second = threading.Thread(target=ask, args=("second", ck.tensors[-1]))
            second.start()
            second.join(0.2)
            release.set()
            first.join(30)
            second.join(30)
        assert found == {"first": (ck.root, 0), "second": (ck.root, 299)}
