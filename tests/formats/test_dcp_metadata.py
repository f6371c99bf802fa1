"""The ``.metadata`` pickle as other writers make it: pathlib globals of Python 3.13 (``pathlib._local``), a
plain-string ``checkpoint_id`` (fsspec), none at all, other pickle protocols, older files without
``storage_meta``/``version``; and names that are not a ``Metadata``."""

from __future__ import annotations

import pickle
import sys
import types
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import torch
from dcp_writers import raw_bytes, simulate_ranks
from torch.distributed.checkpoint.metadata import Metadata

import ckptfs
from ckptfs.errors import CorruptCheckpointError
from ckptfs.formats.dcp_metadata import parse_metadata
from ckptfs.limits import Limits


class _LocalPosixPath:
    """Pickles as ``pathlib._local.PosixPath('/a/b')``, as CPython 3.13 writes a path."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __reduce__(self) -> tuple[Any, ...]:
        return _LocalPosixPath, (self.text,)


@pytest.fixture
def local_pathlib() -> Iterator[None]:
    module = types.ModuleType("pathlib._local")
    _LocalPosixPath.__module__, _LocalPosixPath.__qualname__ = "pathlib._local", "PosixPath"
    module.PosixPath = _LocalPosixPath  # type: ignore[attr-defined]
    sys.modules["pathlib._local"] = module
    try:
        yield
    finally:
        del sys.modules["pathlib._local"]
        _LocalPosixPath.__module__, _LocalPosixPath.__qualname__ = __name__, "_LocalPosixPath"


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    state = {"m": {"w": torch.arange(30.0).reshape(5, 6)}, "step": 2}
    path = tmp_path_factory.mktemp("dcp_md") / "sim"
    simulate_ranks(state, {"m.w": (1, 2)}, path, world=2)
    return path, state


def _rewritten(sharded: tuple[Path, dict[str, Any]], tmp_path: Path, change: Callable[[Metadata], None],
               protocol: int = 4) -> Path:
    import shutil

    path = tmp_path / "copy"
    shutil.copytree(sharded[0], path)
    md = pickle.loads((path / ".metadata").read_bytes())
    change(md)
    (path / ".metadata").write_bytes(pickle.dumps(md, protocol=protocol))
    return path


def _checkpoint_id(value: Any) -> Callable[[Metadata], None]:
    def change(md: Metadata) -> None:
        md.storage_meta.checkpoint_id = value  # type: ignore[union-attr]
    return change


def _no_provenance(md: Metadata) -> None:
    del md.storage_meta, md.version  # files older than both fields


CHANGES: dict[str, tuple[Callable[[Metadata], None], int]] = {
    "fsspec_string": (_checkpoint_id("s3://bucket/step1000"), 4),
    "no_checkpoint_id": (_checkpoint_id(None), 4),
    "protocol_5": (lambda md: None, 5),
    "protocol_2": (lambda md: None, 2),
    "no_storage_meta_or_version": (_no_provenance, 4),
}


@pytest.mark.parametrize("name", CHANGES)
def test_writer_variants_read_the_same(name: str, sharded: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    change, protocol = CHANGES[name]
    path = _rewritten(sharded, tmp_path, change, protocol)
    with ckptfs.open(path) as ck:
        assert ck.root["step"] == 2
        assert ck.read(ck.tensor(("m", "w"))) == raw_bytes(sharded[1]["m"]["w"])


def test_python_3_13_pathlib(local_pathlib: None, sharded: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    path = _rewritten(sharded, tmp_path, _checkpoint_id(_LocalPosixPath("/a/b")))
    assert b"pathlib._local" in (path / ".metadata").read_bytes()
    with ckptfs.open(path) as ck:
        assert ck.read(ck.tensor(("m", "w"))) == raw_bytes(sharded[1]["m"]["w"])


def test_planner_data_off_keeps_fqns_whole(tmp_path: Path) -> None:
    """``flatten_state_dict=False``: no planner_data; every top-level item is an FQN of its own."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    state = {"model": {"a": 1, "t": torch.ones(2)}, "t": torch.arange(3)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=tmp_path / "d", planner=DefaultSavePlanner(flatten_state_dict=False),
                 no_dist=True)
    with ckptfs.open(tmp_path / "d") as ck:
        assert list(ck.root) == ["model", "t"] and ck.read(ck.tensor(("t",))) == raw_bytes(torch.arange(3))
        model = ck.root["model"]  # one pickled item, its tensor inside
        assert model["a"] == 1 and ck.read(model["t"]) == raw_bytes(torch.ones(2))


@pytest.mark.parametrize("data, reason", [
    (pickle.dumps({"state_dict_metadata": {}}), r"the metadata is a dict, not a Metadata"),
    (b"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00\x8c%torch.distributed.checkpoint.metadata\x8c\x08Metadata\x93)\x81"
     b"}(\x8c\x13state_dict_metadata]ub.", r"state_dict_metadata is a list, not a dict"),
])
def test_not_a_metadata(data: bytes, reason: str) -> None:
    with pytest.raises(CorruptCheckpointError, match=reason):
        parse_metadata(data, Limits())
