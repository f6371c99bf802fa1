"""``ckptfs info --json``'s text: the same as encoding the description value by value, and bounded."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from corpus import CORPUS_NAMES, CorpusFile, save_zip

import ckptfs
from ckptfs import LimitExceededError, Limits
from ckptfs.cli.info import description_text, indented, summary
from ckptfs.fs.describe import encode_tree, json_text, storage_metadata, tensor_metadata


def plain_description(ck: ckptfs.Checkpoint) -> str:
    return json_text({**summary(ck), "storages": [storage_metadata(s) for s in ck.storages],
                      "tensors": [tensor_metadata(t) for t in ck.tensors], "tree": encode_tree(ck.root)})


@pytest.mark.parametrize("name", CORPUS_NAMES)
def test_text_is_the_plain_encoding(corpus: dict[str, CorpusFile], name: str) -> None:
    with ckptfs.open(corpus[name].path) as ck:
        assert description_text(ck) == plain_description(ck)


def test_strings_that_look_like_its_markers_stay_strings(tmp_path: Path) -> None:
    """Tensors stand in the tree as markers while it is encoded; a checkpoint's own strings are never replaced."""
    shared = torch.arange(3.0)
    obj = {"a": shared, "b": [shared, "\x00ckptfs:tensor:00:0", {"\x00ckptfs:tensor:": shared}], "c": torch.ones(2)}
    with ckptfs.open(save_zip(obj, tmp_path / "m.pt")) as ck:
        text = description_text(ck)
        assert text == plain_description(ck)
        assert json.loads(text)["tree"]["b"][1] == "\x00ckptfs:tensor:00:0"


def test_a_description_past_the_limit_fails_naming_the_file(tmp_path: Path) -> None:
    path = save_zip({f"t{n}": torch.zeros(2) for n in range(20)}, tmp_path / "t.pt")
    with ckptfs.open(path) as ck:
        size = len(description_text(ck))
    with ckptfs.open(path, Limits(max_generated_bytes=size // 2)) as ck:
        with pytest.raises(LimitExceededError) as raised:
            description_text(ck)
    assert str(raised.value) == (f"{path}: the JSON description would exceed {size // 2} bytes "
                                 "(limit max_generated_bytes)")
    assert re.search(r"\(limit max_generated_bytes\)$", raised.value.reason)


CLI = [sys.executable, "-m", "ckptfs.cli"]


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("name", ["r1_views_containers", "r5_scripted", "r3_legacy", "whole_module"])
@pytest.mark.parametrize("indent", ["0", "2"])
def test_indent_lays_out_the_same_json(corpus: dict[str, CorpusFile], name: str, indent: str) -> None:
    compact, laid_out = run("info", "--json", corpus[name].path), run("info", "--json", "--indent", indent,
                                                                     corpus[name].path)
    assert (compact.returncode, compact.stderr, laid_out.returncode, laid_out.stderr) == (0, "", 0, "")
    assert compact.stdout.count("\n") == 1
    assert laid_out.stdout == json.dumps(json.loads(compact.stdout), indent=int(indent)) + "\n"


def test_indent_of_deep_json_does_not_recurse() -> None:
    deep = "[" * 5000 + '{"a": [], "b": {}}' + "]" * 5000
    text = indented(deep, 1, 1 << 30)
    assert text.count("\n") == 2 * 5000 + 3
    assert text.splitlines()[5000] == " " * 5000 + "{"


def test_indent_is_bounded() -> None:
    deep = "[" * 3000 + "]" * 3000
    with pytest.raises(LimitExceededError, match=r"^the indented JSON description would exceed 100000 bytes "
                                                 r"\(limit max_generated_bytes\)$"):
        indented(deep, 4, 100_000)
    assert indented(deep, 4, 50_000_000).splitlines()[2999] == " " * 4 * 2999 + "[]"
    shallow = "[" * 500 + "]" * 500
    assert indented(shallow, 4, 10_000_000) == json.dumps(json.loads(shallow), indent=4)


@pytest.mark.parametrize("indent", [False, True])
def test_the_error_says_which_limit_to_raise(tmp_path: Path, indent: bool) -> None:
    """Past max_generated_bytes, by the compact text or only once laid out, the error says how to allow more."""
    path = save_zip({f"t{n}": torch.zeros(2) for n in range(20)}, tmp_path / "t.pt")
    compact = len(run("info", "--json", path).stdout) - 1
    laid_out = len(run("info", "--json", "--indent", "2", path).stdout) - 1
    limit = (compact + laid_out) // 2 if indent else compact // 2
    argv = ["info", "--json", *(["--indent", "2"] if indent else []), path]
    result = run(*argv, "--limit", f"max_generated_bytes={limit}")
    assert result.returncode == 1 and result.stdout == ""
    described = "indented JSON description" if indent else "JSON description"
    assert result.stderr == (f"ckptfs: {path}: the {described} would exceed {limit} bytes (limit max_generated_bytes); "
                             f"to allow more: --limit max_generated_bytes=VALUE (now {limit})\n")
    assert run(*argv, "--limit", f"max_generated_bytes={laid_out}").returncode == 0
