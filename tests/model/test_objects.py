"""Inert objects keep what the pickle gave them: arguments, keyword arguments, items and every state.

Through the Python API (the tree and its JSON), ``ckptfs info --json`` (the real command) here; through a
real mount in ``tests/mount/test_tree.py``.
"""

from __future__ import annotations

import json
import pickle
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hostile.containers import zip_checkpoint
from hostile.picklegen import (
    APPENDS,
    BUILD,
    EMPTY_TUPLE,
    MARK,
    NEWOBJ,
    NEWOBJ_EX,
    SETITEMS,
    b,
    call,
    dct,
    glob,
    i,
    s,
    tup,
)
from hostile.picklegen import pickle as make_pickle
from shapes import LS_LA, omegaconf_like

import ckptfs
from ckptfs import LimitExceededError, Limits
from ckptfs.fs.describe import TextBudget, encode_tree
from ckptfs.fs.layout import Layout
from ckptfs.model.tree import ARGS_KEY, CALLABLE_KEY, KWARGS_KEY, STATE_KEY, children
from ckptfs.pickle.unpickler import load_at
from ckptfs.pickle.values import Global, PickledObject

CLI = [sys.executable, "-m", "ckptfs.cli"]


def _namespace(*state: bytes) -> bytes:
    return glob("argparse", "Namespace") + EMPTY_TUPLE + NEWOBJ + b"".join(part + BUILD for part in state)


OBJECTS: dict[str, tuple[bytes, list[tuple[Any, Any]]]] = {
    "reduce_plain_argument": (LS_LA, [(ARGS_KEY, ("ls -la",))]),
    "reduce_every_kind_of_argument": (
        make_pickle(call(glob("m", "f"), s("t"), i(7), b"G" + struct.pack(">d", 1.5), b(b"\x00\xff"), b"N", b"\x88",
                         glob("m", "g"))),
        [(ARGS_KEY, ("t", 7, 1.5, b"\x00\xff", None, True, Global("m", "g")))]),
    "newobj_ex_keyword_arguments": (
        make_pickle(glob("functools", "partial") + tup(glob("subprocess", "run"), s("rm -rf x"))
                    + dct((s("shell"), b"\x88"), (s("cwd"), s("/"))) + NEWOBJ_EX),
        [(ARGS_KEY, (Global("subprocess", "run"), "rm -rf x")), (KWARGS_KEY, {"shell": True, "cwd": "/"})]),
    "newobj_ex_keywords_not_a_dict": (
        make_pickle(glob("m", "C") + EMPTY_TUPLE + s("not a dict") + NEWOBJ_EX), [(KWARGS_KEY, "not a dict")]),
    "build_plain_state": (make_pickle(_namespace(s("state text"))), [(STATE_KEY, "state text")]),
    "build_attributes": (make_pickle(_namespace(dct((s("a"), i(1)), (s("b"), s("x"))))), [("a", 1), ("b", "x")]),
    "build_twice": (
        make_pickle(_namespace(dct((s("__setstate__"), glob("os", "system"))), s("touch x"))),
        [("__setstate__", Global("os", "system")), (STATE_KEY, "touch x")]),
    "build_slots_pair": (
        make_pickle(_namespace(tup(dct((s("a"), i(1))), dct((s("b"), i(2)))))), [("a", 1), ("b", 2)]),
    "build_slots_pair_sharing_a_key": (
        make_pickle(_namespace(tup(dct((s("a"), i(1))), dct((s("a"), i(2)))))), [(STATE_KEY, ({"a": 1}, {"a": 2}))]),
    "items_set_on_an_object": (
        make_pickle(glob("m", "C") + EMPTY_TUPLE + NEWOBJ + MARK + s("k") + s("v") + i(3) + s("three") + SETITEMS
                    + MARK + s("first") + i(2) + APPENDS + dct((s("attr"), b"N")) + BUILD),
        [("k", "v"), (3, "three"), (0, "first"), (1, 2), (STATE_KEY, {"attr": None})]),
}


@pytest.mark.parametrize("name", OBJECTS)
def test_an_object_shows_everything_the_pickle_gave_it(name: str) -> None:
    data, expected = OBJECTS[name]
    obj, _ = load_at(data)
    assert isinstance(obj, PickledObject)
    assert children(obj) == expected
    encoded = encode_tree(obj)["$object"]
    assert [key for key, _ in encoded["children"]] == [key for key, _ in expected]


def test_a_call_of_a_call_shows_what_was_called() -> None:
    """``getattr(import_module('os'), 'system')('touch x')``: the callable, itself a call, is ``__callable__``."""
    chain = call(call(glob("builtins", "getattr"), call(glob("importlib", "import_module"), s("os")), s("system")),
                 s("touch x"))
    obj, _ = load_at(make_pickle(chain))
    assert [key for key, _ in children(obj)] == [CALLABLE_KEY, ARGS_KEY]
    assert encode_tree(obj) == {"$object": {"class": "PickledObject", "children": [
        [CALLABLE_KEY, {"$object": {"class": "builtins.getattr", "children": [[ARGS_KEY, {"$tuple": [
            {"$object": {"class": "importlib.import_module", "children": [[ARGS_KEY, {"$tuple": ["os"]}]]}},
            "system"]}]]}}],
        [ARGS_KEY, {"$tuple": ["touch x"]}]]}}


def test_an_object_as_a_dict_key_shows_its_arguments(tmp_path: Path) -> None:
    """A key is shown by its bounded repr (``$repr``), arguments included; the name escapes it."""
    path = tmp_path / "key.pt"
    path.write_bytes(zip_checkpoint(make_pickle(dct((call(glob("os", "system"), s("touch x")), s("v"))))))
    with ckptfs.open(path) as ck:
        layout = Layout(ck)
        (node,) = layout.children(layout.root)
        assert node.name == '%={"$repr":"<os.system(\'touch x\',)>"}'
        assert json.loads(layout.index_bytes())["entries"][1]["key"] == {"$repr": "<os.system('touch x',)>"}


def test_posix_system_keeps_its_command() -> None:
    obj, _ = load_at(LS_LA)
    assert encode_tree(obj) == {"$object": {"class": "posix.system", "children": [[ARGS_KEY, {"$tuple": ["ls -la"]}]]}}


def test_info_json_shows_the_command(tmp_path: Path) -> None:
    path = tmp_path / "system.pt"
    path.write_bytes(zip_checkpoint(LS_LA))
    with ckptfs.open(path) as ck:
        assert isinstance(ck.root, PickledObject) and ck.root.args == ("ls -la",)
        assert children(ck.root) == [(ARGS_KEY, ("ls -la",))]
    result = subprocess.run([*CLI, "info", "--json", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert json.loads(result.stdout)["tree"] == {
        "$object": {"class": "posix.system", "children": [["__args__", {"$tuple": ["ls -la"]}]]}}


# -- an omegaconf-like configuration, pickled by Python's own pickle ---------------------------------------


def test_omegaconf_like_values_survive(fake_omegaconf: dict[str, type], tmp_path: Path) -> None:
    config = omegaconf_like(fake_omegaconf)
    path = tmp_path / "config.pt"
    path.write_bytes(zip_checkpoint(pickle.dumps({"cfg": config, "epoch": 3}, protocol=2)))
    with ckptfs.open(path) as ck:
        content = dict(children(dict(children(ck.root["cfg"]))["_content"]))
        assert dict(children(content["lr"]))["_val"] == 0.001
        assert dict(children(content["name"]))["_val"] == "run-7"
        color = dict(children(content["color"]))["_val"]
        assert isinstance(color, PickledObject) and color.class_name == "myapp.config.Color"
        assert children(color) == [(ARGS_KEY, ("red",))]
        assert children(dict(children(content["budget"]))["_val"]) == [(ARGS_KEY, ("0.1",))]
    result = subprocess.run([*CLI, "info", "--json", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    tree = json.loads(result.stdout)["tree"]
    nodes = dict(dict(tree["cfg"]["$object"]["children"])["_content"])
    assert dict(nodes["lr"]["$object"]["children"])["_val"] == 0.001
    assert dict(nodes["name"]["$object"]["children"])["_val"] == "run-7"
    assert dict(nodes["color"]["$object"]["children"])["_val"] == {
        "$object": {"class": "myapp.config.Color", "children": [["__args__", {"$tuple": ["red"]}]]}}
    assert dict(nodes["budget"]["$object"]["children"])["_val"] == {
        "$object": {"class": "decimal.Decimal", "children": [["__args__", {"$tuple": ["0.1"]}]]}}
    metadata = dict(dict(nodes["color"]["$object"]["children"])["_metadata"]["$object"]["children"])
    assert metadata == {"ref_type": {"$global": "myapp.config.Color"}, "key": "color", "optional": False}


# -- what is shown stays within the limits ------------------------------------------------------------------


def _object_file(tmp_path: Path, body: bytes) -> Path:
    path = tmp_path / "object.pt"
    path.write_bytes(zip_checkpoint(make_pickle(body)))
    return path


def test_arguments_count_as_tree_nodes(tmp_path: Path) -> None:
    path = _object_file(tmp_path, call(glob("m", "f"), *(i(n) for n in range(100))))
    with ckptfs.open(path, limits=Limits(max_tree_nodes=200)) as ck:
        assert children(ck.root) == [(ARGS_KEY, tuple(range(100)))]
    with pytest.raises(LimitExceededError, match=r"more than 50 nodes \(limit max_tree_nodes\)"):
        ckptfs.open(path, limits=Limits(max_tree_nodes=50))


def test_keyword_argument_keys_count_as_key_bytes(tmp_path: Path) -> None:
    path = _object_file(tmp_path, glob("m", "C") + EMPTY_TUPLE + dct((s("k" * 1000), i(1))) + NEWOBJ_EX)
    with pytest.raises(LimitExceededError, match=r"\(limit max_key_bytes\)"):
        ckptfs.open(path, limits=Limits(max_key_bytes=500))


def test_a_long_argument_counts_as_generated_text(tmp_path: Path) -> None:
    path = _object_file(tmp_path, call(glob("m", "f"), s("x" * 10_000)))
    with ckptfs.open(path) as ck:
        assert len(json.dumps(encode_tree(ck.root, TextBudget(20_000)))) > 10_000
        with pytest.raises(LimitExceededError, match=r"exceed 4096 bytes \(limit max_generated_bytes\)"):
            encode_tree(ck.root, TextBudget(4096))
    result = subprocess.run([*CLI, "--limit", "max_generated_bytes=4096", "info", "--json", str(path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "max_generated_bytes" in result.stderr and result.stderr.count("\n") == 1
