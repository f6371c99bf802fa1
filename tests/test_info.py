"""``ckptfs info --json``'s text: the same as encoding the description value by value, and bounded."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

import ckptfs
from ckptfs import LimitExceededError, Limits
from ckptfs.describe import encode_tree, json_text, tensor_metadata
from ckptfs.info import description_text, summary
from corpus import CORPUS_NAMES, CorpusFile, save_zip


def plain_description(ck: ckptfs.Checkpoint) -> str:
    return json_text({**summary(ck), "tensors": [tensor_metadata(t) for t in ck.tensors],
                      "tree": encode_tree(ck.root)})


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
