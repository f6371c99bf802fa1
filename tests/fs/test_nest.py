"""``--nest``: the rule (fs.nest) on keys chosen for each case, and every path leading back to its exact key."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from corpus import save_zip
from hypothesis import given, settings
from hypothesis import strategies as st

import ckptfs
from ckptfs.fs.layout import Layout
from ckptfs.fs.nest import MAX_PARTS, Group, nested
from ckptfs.fs.nodes import Dir, Kind, Node


def _shape(pairs: list) -> list:
    """Pairs as nested lists of names: a Group as ``[name, [...]]``."""
    return [[key, _shape(child.pairs)] if isinstance(child, Group) else key for key, child in pairs]


def test_every_dot_but_the_last_makes_a_directory() -> None:
    pairs = [("model.layers.0.mlp.w1.weight", 1), ("model.layers.0.mlp.w1.bias", 2), ("model.norm.weight", 3),
             ("lm_head.weight", 4), ("step", 5), ("model.layers.1.mlp.w1.weight", 6)]
    assert _shape(nested(pairs)) == [
        ["model", [["layers", [["0", [["mlp", ["w1.weight", "w1.bias"]]]], ["1", [["mlp", ["w1.weight"]]]]]],
                   "norm.weight"]],
        "lm_head.weight", "step"]


def test_keys_shown_whole_and_a_name_taken_by_a_whole_key() -> None:
    pairs = [("a", 1), ("a.b.c", 2), ("x..y.z", 3), (".h.i.j", 4), ("k.l.", 5), (7, 6), ("p.q", 7),
             ("." * 3, 8), ("m." * (MAX_PARTS - 1) + "m", 9), ("n." * MAX_PARTS + "n", 10)]
    shown = _shape(nested(pairs))
    assert shown[:8] == ["a", "a.b.c", "x..y.z", ".h.i.j", "k.l.", 7, "p.q", "..."]
    assert shown[9] == "n." * MAX_PARTS + "n"  # too many parts: whole
    depth, level = 0, shown[8]
    while isinstance(level, list):
        depth, level = depth + 1, level[1][0]
    assert depth == MAX_PARTS - 2 and level == "m.m"


def test_only_a_whole_key_of_one_part_can_take_a_directory_s_name() -> None:
    """Inside a directory every key left has two parts or more: ``a.b`` beside ``a/b/`` is no collision."""
    pairs = [("a.b.c.d", 1), ("a.b", 2), ("a.b.e.f", 3)]
    assert _shape(nested(pairs)) == [["a", [["b", ["c.d", "e.f"]]]], "a.b"]


def _walk(layout: Layout) -> list[tuple[str, Node, list]]:
    found, stack = [], [(layout.root, "", [])]
    while stack:
        directory, folder, keys = stack.pop()
        for node in layout.children(directory):
            path, node_keys = folder + node.name, keys + [node.key]
            found.append((path, node, node_keys))
            if isinstance(node, Dir):
                stack.append((node, path + "/", node_keys))
    return found


def test_each_path_joins_back_to_its_exact_key_and_the_index_keeps_exact_paths(tmp_path: Path) -> None:
    w = torch.arange(4.0)
    sd = {"model.layers.0.mlp.w1.weight": w, "model.layers.0.mlp.w1.bias": torch.ones(2), "a": torch.zeros(1),
          "a.b.c": torch.ones(1), "model.tied.w": w, "x.json.y": torch.zeros(3), "opt": {"s.t.u": 3}}
    with ckptfs.open(save_zip(sd, tmp_path / "n.pt")) as ck:
        layout = Layout(ck, nest=True)
        tensors = {id(t): t for t in ck.tensors}
        walked = _walk(layout)
        for path, node, keys in walked:
            if node.kind is Kind.TENSOR:
                assert (".".join(keys),) == tensors[id(node.value)].path, path
        assert [keys for path, _, keys in walked if path == "opt/s/t.u"] == [["opt", "s", "t.u"]]
        assert layout.lookup("/model/layers/0/mlp/w1.weight").value is ck.tensors[0]  # type: ignore[union-attr]
        assert layout.lookup("/model/tied.w").kind is Kind.LINK  # type: ignore[union-attr]
        assert layout.link_target(layout.lookup("/model/tied.w")) == "layers/0/mlp/w1.weight"  # type: ignore[arg-type]
        assert layout.lookup("/x/json.y").kind is Kind.TENSOR  # type: ignore[union-attr]
        assert layout.lookup("/opt/s/t.u").kind is Kind.VALUE  # type: ignore[union-attr]
        index = json.loads(layout.index_bytes())
        assert {t["file"]: t["path"] for t in index["tensors"]} == {
            "model/layers/0/mlp/w1.weight": ["model.layers.0.mlp.w1.weight"],
            "model/layers/0/mlp/w1.bias": ["model.layers.0.mlp.w1.bias"], "a": ["a"], "a.b.c": ["a.b.c"],
            "x/json.y": ["x.json.y"]}
        groups = [e for e in index["entries"] if e.get("kind") == "nest"]
        assert {g["prefix"] for g in groups} == {"model", "model.layers", "model.layers.0", "model.layers.0.mlp",
                                                 "x", "s"}
        sidecar = json.loads(layout.content(layout.lookup("/model/layers/0/mlp/w1.weight.json")))  # type: ignore[arg-type]
        assert sidecar["path"] == ["model.layers.0.mlp.w1.weight"]
        header = layout.safetensors(layout.lookup("/model.safetensors"))  # type: ignore[arg-type]
        flat = Layout(ck)
        assert sorted(header.names) == sorted(  # the same names: the keys, whole
            flat.safetensors(flat.lookup("/model.safetensors")).names)  # type: ignore[arg-type]


def test_without_nest_nothing_changes(tmp_path: Path) -> None:
    sd = {"model.layers.0.w.weight": torch.ones(1)}
    with ckptfs.open(save_zip(sd, tmp_path / "f.pt")) as ck:
        assert [n.name for n in Layout(ck).children(Layout(ck).root)] == ["model.layers.0.w.weight"]


def test_keys_sharing_no_parts_leave_their_dict_flat() -> None:
    """Each key would be a chain of directories, one per part: the dict is shown as it is, in bounded time."""
    pairs = [(f"k{n}." + ".".join("x" * 60), n) for n in range(1000)]
    assert nested(pairs) == pairs
    moe = [(f"model.layers.{n // 192}.mlp.experts.{n % 64}.w{n % 3}.weight", n) for n in range(1920)]
    assert nested(moe) != moe


def _reference(pairs: list) -> list:
    """The rule as the module docstring states it, level by level, each key's rest joined again at every level
    (fs.nest splits a key once and joins its rest only where it is shown whole): ``[name, prefix, [...]]`` for a
    directory, the key's name for a file."""
    def level(items: list, prefix: str) -> list:
        whole = {name for parts, name in items if parts is None or len(parts) < 3}
        order, groups = [], {}
        for parts, name in items:
            if parts is None or len(parts) < 3 or parts[0] in whole:
                order.append(name)
            else:
                if parts[0] not in groups:
                    groups[parts[0]] = []
                    order.append([parts[0]])
                groups[parts[0]].append((parts[1:], ".".join(parts[1:])))
        found = []
        for entry in order:
            if isinstance(entry, list):
                inner = f"{prefix}.{entry[0]}" if prefix else entry[0]
                entry = [entry[0], inner, level(groups[entry[0]], inner)]
            found.append(entry)
        return found

    items = []
    for key, _ in pairs:
        parts = key.split(".") if isinstance(key, str) else None
        items.append((parts if parts and 3 <= len(parts) <= MAX_PARTS and all(parts) else None, key))
    return level(items, "")


def _directories(shape: list) -> int:
    return sum(1 + _directories(entry[2]) for entry in shape if isinstance(entry, list))


def _named(pairs: list) -> list:
    return [[key, child.prefix, _named(child.pairs)] if isinstance(child, Group) else key for key, child in pairs]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(0, 3), st.lists(st.sampled_from(["a", "b", "0", "", "a.b"]), min_size=1,
                                                      max_size=7).map(".".join)), max_size=40, unique=True))
def test_the_rule_matches_its_reference_on_any_keys(keys: list) -> None:
    pairs = [(key, position) for position, key in enumerate(keys)]
    budget_met = len(keys) * 2 + 64
    reference = _reference(pairs)
    found = nested(pairs)
    if found is pairs:  # too many directories: only when the reference makes more than the budget
        assert _directories(reference) > budget_met
        return
    assert _named(found) == reference
    flat = {}
    stack = [(found, "")]
    while stack:
        level, prefix = stack.pop()
        for key, child in level:
            if isinstance(child, Group):
                stack.append((child.pairs, child.prefix + "."))
            else:
                flat[prefix + key if prefix else key] = child
    assert flat == {key: position for position, key in enumerate(keys)}
