"""``ckptfs diff`` matches places by exact key path, never merging two, and compares the values beside tensors."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from cache.helpers import written_entries

CLI = [sys.executable, "-m", "ckptfs.cli"]


class Config:
    """Pickled by reference: ckptfs shows it as an inert object with its attributes."""

    def __init__(self, lr: float) -> None:
        self.lr = lr


def diff(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "diff", "--no-cache", *map(str, args)], capture_output=True, text=True, timeout=120)


def diff_json(a: Path, b: Path, *options: str) -> tuple[int, dict[str, dict[str, Any]], dict[str, Any]]:
    """Exit status, each record by its file (unique, unlike dotted keys), the summary."""
    result = diff("--json", *options, a, b)
    assert result.stderr == ""
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    records = {line["file"]: line for line in lines[:-1]}
    assert len(records) == len(lines) - 1
    return result.returncode, records, lines[-1]["summary"]


def saved(tmp_path: Path, name: str, value: Any) -> Path:
    torch.save(value, tmp_path / name)
    return tmp_path / name


def test_an_int_key_and_its_string_are_two_tensors(tmp_path: Path) -> None:
    a = saved(tmp_path, "ik1.pt", {0: torch.ones(2), "0": torch.zeros(2)})
    b = saved(tmp_path, "ik2.pt", {0: torch.ones(2), "0": torch.full((2,), 9.0)})
    status, records, summary = diff_json(a, b)
    assert status == 1
    assert {file: (r["path"], r["status"]) for file, r in records.items()} == {
        "0": ([0], "equal"), "%30": (["0"], "differ")}
    assert (records["%30"]["differing"], records["%30"]["max_abs"]) == (2, 9.0)
    assert (summary["tensors"], summary["equal"], summary["differ"]) == (2, 1, 1)
    text = diff(a, b)
    assert text.returncode == 1
    assert text.stdout.splitlines()[0] == "differs    %30  2 of 2 elements, max abs 9, max rel inf"


def test_a_dotted_key_and_the_same_keys_nested_are_two_tensors(tmp_path: Path) -> None:
    a = saved(tmp_path, "d1.pt", {"a.b": torch.ones(2), "a": {"b": torch.zeros(2)}})
    b = saved(tmp_path, "d2.pt", {"a.b": torch.ones(2), "a": {"b": torch.full((2,), 9.0)}})
    status, records, _ = diff_json(a, b)
    assert status == 1
    assert {file: (r["key"], r["path"], r["status"]) for file, r in records.items()} == {
        "a.b": ("a.b", ["a.b"], "equal"), "a/b": ("a.b", ["a", "b"], "differ")}
    assert diff(a, a).returncode == 0


def test_values_that_differ_are_counted_and_named(tmp_path: Path) -> None:
    weights = torch.arange(4.0)
    common = {"w": weights, "none": None, "ratio": 0.5, "same": [1, "x"]}
    a = saved(tmp_path, "a.pt", {**common, "epoch": 3, "name": "run-a", "nested": {"layers": [1, 2]},
                                 "shape": [2, 3], "config": Config(0.1), "gone": 7})
    b = saved(tmp_path, "b.pt", {**common, "epoch": 4, "name": "run-b", "nested": {"layers": [1, 3]},
                                 "shape": (2, 3), "config": Config(0.2), "new": None})
    status, records, summary = diff_json(a, b)
    assert status == 1
    values = {file: r for file, r in records.items() if r["type"] == "value"}
    assert {file: r["status"] for file, r in values.items() if r["status"] != "equal"} == {
        "epoch": "differ", "name": "differ", "nested/layers/1": "differ", "shape": "differ", "config/lr": "differ",
        "gone": "only_in_a", "new": "only_in_b"}
    assert (values["epoch"]["a"]["value"], values["epoch"]["b"]["value"]) == (3, 4)
    assert (values["name"]["a"]["value"], values["name"]["b"]["value"]) == ("run-a", "run-b")
    assert (values["shape"]["a"]["value"], values["shape"]["b"]["value"]) == ({"kind": "list"}, {"kind": "tuple"})
    assert summary["values"] == {"total": 14, "equal": 7, "differ": 5, "only_in_a": 1, "only_in_b": 1}
    assert (summary["tensors"], summary["equal"]) == (1, 1)
    text = diff(a, b).stdout.splitlines()
    assert text[:7] == ['differs    epoch            3 -> 4',
                        'differs    name             "run-a" -> "run-b"',
                        'differs    nested/layers/1  2 -> 3',
                        'differs    shape            {"kind": "list"} -> {"kind": "tuple"}',
                        'differs    config/lr        0.1 -> 0.2',
                        'only in A  gone             7',
                        'only in B  new              null']
    assert text[7].startswith("1 tensor path: 1 equal, 0 differ, 0 changed dtype or shape, 0 only in A, 0 only in B; "
                              "14 other values: 7 equal, 5 differ, 1 only in A, 1 only in B (")


def test_only_a_value_changed_exits_1(tmp_path: Path) -> None:
    state = {"w": torch.ones(3)}
    a = saved(tmp_path, "a.pt", {"model": state, "epoch": 1})
    b = saved(tmp_path, "b.pt", {"model": state, "epoch": 2})
    result = diff(a, b)
    assert (result.returncode, result.stdout.splitlines()[0]) == (1, "differs    epoch  1 -> 2")


def test_aliases_are_compared_and_said_so(tmp_path: Path) -> None:
    t = torch.arange(6.0).reshape(2, 3)
    a = saved(tmp_path, "a.pt", {"a": t, "b": t, "c": {"d": t}, "tt": t.t()})
    untied = torch.arange(6.0).reshape(2, 3)
    b = saved(tmp_path, "b.pt", {"a": t, "b": untied, "c": {"d": t}, "tt": t.t()})
    status, records, summary = diff_json(a, b)
    assert status == 0
    assert {file: (r["a"]["alias_of"], r["b"]["alias_of"]) for file, r in records.items() if r["type"] == "tensor"} \
        == {"a": (None, None), "b": ("a", None), "c/d": ("a", "a"), "tt": (None, None)}
    assert (summary["tensors"], summary["equal"], summary["aliases"]) == (4, 4, 2)
    lines = diff("-s", a, b).stdout.splitlines()
    assert lines[:4] == ["equal      a", "equal      b    (alias of a in A)",
                         "equal      c/d  (alias of a in A and B)", "equal      tt"]
    assert lines[4].startswith("4 tensor paths (2 aliases): 4 equal, 0 differ")


def test_diff_uses_the_metadata_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPTFS_PICKLE_COMPILED", "0")  # else a zip is cached from MIN_TENSORS_SCANNED tensors on
    a = saved(tmp_path, "a.pt", {f"layer.{n}": torch.full((2,), float(n)) for n in range(300)})
    cache = tmp_path / "cache"
    outputs = []
    for _ in range(2):
        result = subprocess.run([*CLI, "diff", "--json", "--cache-dir", str(cache), str(a), str(a)],
                                capture_output=True, text=True, timeout=120)
        assert (result.returncode, result.stderr) == (0, "")
        outputs.append(result.stdout.splitlines()[:-1])
        assert len(written_entries(cache)) == 1
    assert outputs[0] == outputs[1] and len(outputs[0]) == 300
    assert collections.Counter(json.loads(line)["status"] for line in outputs[0]) == {"equal": 300}




class Net(torch.nn.Module):
    """Nested Sequentials, a buffer and a non-persistent one, a weight tied across two modules, a norm with buffers."""

    def __init__(self) -> None:
        super().__init__()
        self.seq = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(),
                                       torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.LayerNorm(2)))
        self.register_buffer("running", torch.zeros(2))
        self.register_buffer("scratch", torch.ones(2), persistent=False)
        self.head = torch.nn.Linear(2, 3, bias=False)
        self.embed = torch.nn.Embedding(3, 2)
        self.embed.weight = self.head.weight
        self.norm = torch.nn.BatchNorm1d(3)


@pytest.mark.parametrize("make", [Net, lambda: torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(
    torch.nn.Conv1d(1, 2, 3), torch.nn.GRU(2, 3)))], ids=["net", "sequential"])
def test_state_dict_names_of_a_whole_module(tmp_path: Path, make: Any) -> None:
    torch.manual_seed(5)
    model = make()
    whole = saved(tmp_path, "whole.pt", model)
    state = saved(tmp_path, "state.pt", model.state_dict())
    listed = subprocess.run([*CLI, "ls", "--json", "--state-dict", str(whole)], capture_output=True, text=True,
                            timeout=120)
    assert (listed.returncode, listed.stderr) == (0, "")
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [row["path"] for row in rows] == [[key] for key in model.state_dict()]
    assert diff(whole, state).returncode == 1
    status, records, summary = diff_json(whole, state, "--state-dict")
    assert status == 0 and summary["equal"] == summary["tensors"] == len(model.state_dict())
    for key, tensor in model.state_dict().items():
        cat = subprocess.run([*CLI, "cat", "--state-dict", str(whole), key], capture_output=True, timeout=120)
        assert (cat.returncode, cat.stdout) == (0, tensor.detach().contiguous().numpy().tobytes()), key
