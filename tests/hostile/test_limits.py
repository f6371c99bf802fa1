"""Every limit has a documented default, is enforced with a message naming it, and can be changed."""

from __future__ import annotations

import ast
import zipfile
from pathlib import Path
from typing import Callable

import pytest

import ckptfs
from ckptfs.errors import LimitExceededError
from hostile.cases import FLOATS, TENSOR, _deflated_storage, _zip_records
from hostile.checks import assert_bounded, assert_cli_error, assert_names_file
from hostile.conftest import Runner
from hostile.containers import zip_checkpoint
from hostile.picklegen import EMPTY_LIST, MARK, get, lst, pickle, put

REPO = Path(ckptfs.__file__).resolve().parents[1]


def _deep(depth: int) -> bytes:
    return zip_checkpoint(pickle(EMPTY_LIST * depth + b"a" * (depth - 1)))


def _tensors(count: int) -> bytes:
    return zip_checkpoint(pickle(lst(*[TENSOR] * count)), {"0": FLOATS})


# name: (file, default outcome (None: opens), changed value, outcome with it (None: opens))
LIMITS: dict[str, tuple[Callable[[], bytes], str | None, int, str | None]] = {
    "max_tree_depth": (lambda: _deep(1500), r"nests deeper than 1000 \(limit max_tree_depth\)", 2000, None),
    "max_pickle_inflation": (
        lambda: _zip_records({"data.pkl": pickle(b"N0" * 1_000_000 + b"N", proto=4)}, method=zipfile.ZIP_DEFLATED),
        r"more than 100x \(limit max_pickle_inflation\)", 10_000, None),
    "max_pickle_bytes": (lambda: _deep(10), None, 20, r"zip record 'archive/data\.pkl' of 22 bytes exceeds the limit of 20"),
    "max_memo_entries": (lambda: zip_checkpoint(pickle(b"N" + b"\x94" * 1000, proto=4)), None, 100,
                         r"pickle memo exceeds 100 entries"),
    "max_stack_depth": (lambda: zip_checkpoint(pickle(MARK * 1000 + b"N")), None, 100,
                        r"pickle nests more than 100 MARKs \(limit max_stack_depth\)"),
    "max_zip_entries": (lambda: _tensors(1), None, 2, r"zip has 4 entries \(limit max_zip_entries=2\)"),
    "max_tensors": (lambda: _tensors(10), None, 5, r"more than 5 tensors \(limit max_tensors\)"),
    "max_key_bytes": (lambda: _tensors(10), None, 9,
                      r"keys and tensor key paths total more than 9 bytes \(limit max_key_bytes\)"),
    "max_tree_nodes": (lambda: zip_checkpoint(pickle(b"N" + put(0) + b"0" + lst(*[get(0)] * 1000))), None, 100,
                       r"more than 100 nodes \(limit max_tree_nodes\)"),
}


def test_every_limit_has_a_documented_default() -> None:
    body = next(node for node in ast.parse((REPO / "ckptfs/limits.py").read_text()).body
                if isinstance(node, ast.ClassDef) and node.name == "Limits").body
    documented = {statement.target.id for statement, following in zip(body, body[1:])
                  if isinstance(statement, ast.AnnAssign) and isinstance(following, ast.Expr)
                  and isinstance(following.value, ast.Constant) and isinstance(following.value.value, str)}
    assert documented == set(ckptfs.Limits.names())
    readme = (REPO / "docs" / "limits.md").read_text()
    for name in ckptfs.Limits.names():
        assert f"`{name}`" in readme, f"{name} is missing from the table of limits in docs/limits.md"


def test_every_limit_is_tested_here() -> None:
    """max_inflated_bytes: below; max_generated_bytes bounds what a mount makes: test_pathtext and mount/test_tree."""
    assert set(LIMITS) | {"max_inflated_bytes", "max_generated_bytes"} == set(ckptfs.Limits.names())


@pytest.mark.parametrize("name", LIMITS)
def test_limit_is_enforced_and_can_be_changed(name: str, runner: Runner, tmp_path: Path) -> None:
    build, default_outcome, value, changed_outcome = LIMITS[name]
    path = tmp_path / f"{name}.pt"
    path.write_bytes(build())
    for args, outcome in (((), default_outcome), (("--limit", f"{name}={value}"), changed_outcome)):
        result = runner.run(*args, "info", "--json", path)
        assert_bounded(result)
        if outcome is None:
            assert result.rc == 0, result.stderr
        else:
            assert_cli_error(result, path, outcome)
            assert f"; to allow more: --limit {name}=VALUE (now " in result.stderr, result.stderr


def test_max_inflated_bytes_bounds_reading_a_deflated_storage(tmp_path: Path) -> None:
    path = tmp_path / "bomb.pt"
    path.write_bytes(_deflated_storage(8 << 20, bytes(8 << 20)))
    with ckptfs.open(path) as ck:
        assert ck.read(ck.tensors[0], (8 << 20) - 4) == bytes(4)
    with ckptfs.open(path, ckptfs.Limits(max_inflated_bytes=1 << 20)) as ck:
        with pytest.raises(LimitExceededError) as info:
            ck.read(ck.tensors[0], 0, 4)
        assert_names_file(info.value, path, r"deflated record 'archive/data/0' of 8388608 bytes exceeds 1048576 "
                                            r"\(limit max_inflated_bytes\)")
