"""Hostile torch.distributed.checkpoint directories: a real directory with its ``.metadata`` rewritten to lie
(chunks that overlap, leave holes or leave the tensor, missing files, ranges past the end, huge sizes, path
traversal, planted calls). Each opens or reads into one clean CkptfsError naming the directory, within bounds."""

from __future__ import annotations

import dataclasses
import os
import pickle
import re
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from dcp_writers import simulate_ranks
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex

import ckptfs
from ckptfs.errors import CkptfsError, CorruptCheckpointError, TruncatedPickleError, UnsupportedError
from hostile.checks import assert_bounded, assert_cli_error, assert_names_file
from hostile.conftest import Env, Runner

Mutation = Callable[[Path, Metadata], Any]


def _storage_key(md: Metadata, fqn: str, offset: tuple[int, ...] | None) -> MetadataIndex:
    return next(k for k in md.storage_data if k.fqn == fqn and (k.offset is None or tuple(k.offset) == offset))


def _move_chunk(fqn: str, n: int, offsets: tuple[int, ...]) -> Mutation:
    def mutate(_: Path, md: Metadata) -> None:
        chunk = md.state_dict_metadata[fqn].chunks[n]  # type: ignore[union-attr]
        info = md.storage_data.pop(_storage_key(md, fqn, tuple(chunk.offsets)))
        md.state_dict_metadata[fqn].chunks[n] = dataclasses.replace(chunk, offsets=torch.Size(offsets))  # type: ignore
        md.storage_data[MetadataIndex(fqn, offsets)] = info
    return mutate


def _drop_chunk(_: Path, md: Metadata) -> None:
    md.state_dict_metadata["model.wide"].chunks.pop(1)  # type: ignore[union-attr]


def _storage(fqn: str, chunk: tuple[int, ...] | None, **changes: Any) -> Mutation:
    def mutate(_: Path, md: Metadata) -> None:
        key = _storage_key(md, fqn, chunk)
        md.storage_data[key] = dataclasses.replace(md.storage_data[key], **changes)
    return mutate


def _length_past_end(_: Path, md: Metadata) -> None:
    key = _storage_key(md, "model.wide", (3, 0))
    md.storage_data[key] = dataclasses.replace(md.storage_data[key], length=md.storage_data[key].length + (1 << 40))


def _zstd_bomb(directory: Path, md: Metadata) -> None:
    """A chunk of 72 bytes whose zstd frame, of a few kilobytes, decompresses to 256 MiB."""
    import zstandard

    (directory / "bomb.distcp").write_bytes(zstandard.ZstdCompressor().compress(bytes(256 << 20)))
    key = _storage_key(md, "model.wide", (3, 0))
    md.storage_data[key] = dataclasses.replace(md.storage_data[key], relative_path="bomb.distcp", offset=0,
                                               length=(directory / "bomb.distcp").stat().st_size,
                                               transform_descriptors=["stream.zstd/1"])


def _huge(_: Path, md: Metadata) -> None:
    item = md.state_dict_metadata["model.wide"]
    md.state_dict_metadata["model.wide"] = dataclasses.replace(item, size=torch.Size([1 << 40, 1 << 40]))


def _huge_covered(_: Path, md: Metadata) -> None:
    """A tensor of 2**50 elements with one chunk claiming all of it: opens, and a read fails on that chunk."""
    item = md.state_dict_metadata["model.bias"]
    chunk = dataclasses.replace(item.chunks[0], sizes=torch.Size([1 << 50]))  # type: ignore[union-attr]
    md.state_dict_metadata["model.bias"] = dataclasses.replace(item, size=torch.Size([1 << 50]), chunks=[chunk])


def _dtype(_: Path, md: Metadata) -> None:
    item = md.state_dict_metadata["model.wide"]
    item.properties = dataclasses.replace(item.properties, dtype=torch.float64)  # type: ignore[union-attr]


def _delete_file(directory: Path, _: Metadata) -> None:
    (directory / "__1_0.distcp").unlink()


def _planner(fqn: str, path: tuple[Any, ...]) -> Mutation:
    def mutate(_: Path, md: Metadata) -> None:
        md.planner_data[fqn] = path  # type: ignore[index]
    return mutate


class _Planted:
    def __init__(self, canary: Path) -> None:
        self.canary = canary

    def __reduce__(self) -> tuple[Any, ...]:
        return os.system, (f"touch {self.canary}",)


CASES: dict[str, tuple[Mutation | None, type[CkptfsError], str, bool]] = {
    # name: (mutation, error, reason, fails on opening (else on reading))
    "chunks_overlap": (_move_chunk("model.wide", 1, (2, 0)), CorruptCheckpointError,
                       r"chunks of tensor 'model.wide' at \[2, 0\] and \[0, 0\] overlap", True),
    "chunk_outside": (_move_chunk("model.wide", 2, (7, 0)), CorruptCheckpointError,
                      r"chunk at \[7, 0\] of size \[1, 6\] lies outside tensor 'model.wide' of size \[7, 6\]", True),
    "chunk_missing": (_drop_chunk, CorruptCheckpointError,
                      r"the chunks of tensor 'model.wide' hold 24 elements, its size \[7, 6\] has 42", True),
    "file_missing": (_delete_file, CorruptCheckpointError,
                     r"stored in '__1_0.distcp', which is not in the directory", True),
    "range_past_end": (_length_past_end, CorruptCheckpointError,
                       r"'model.wide' at \[3, 0\] is stored at \[0, 1099511629417\) of '__1_0.distcp', "
                       r"which has", True),
    "huge_size": (_huge, CorruptCheckpointError, r"tensor 'model.wide' of size \[1099511627776, 1099511627776\] "
                  r"has more elements than int64 holds", True),
    "huge_covered": (_huge_covered, CorruptCheckpointError,
                     r"the chunk at \[0\] in '__0_0.distcp' holds a float32 tensor of size \[3\], not float32 of "
                     r"size \[1125899906842624\]", False),
    "path_traversal": (_storage("model.wide", (0, 0), relative_path="../outside.distcp"), CorruptCheckpointError,
                       r"relative_path '../outside.distcp' is not a file name in the directory", True),
    "absolute_path": (_storage("model.wide", (0, 0), relative_path="/etc/passwd"), CorruptCheckpointError,
                      r"relative_path '/etc/passwd' is not a file name in the directory", True),
    "blob_shifted": (_storage("model.wide", (3, 0), offset=1, length=1640), CorruptCheckpointError,
                     r"the chunk at \[3, 0\] in .__1_0.distcp. at \[1, 1641\) is not a torch.save archive|"
                     r"the chunk at \[3, 0\] in .__1_0.distcp. at \[1, 1641\): ", False),
    "wrong_dtype": (_dtype, CorruptCheckpointError, r"holds a float32 tensor of size \[3, 6\], not float64", False),
    "zstd_bomb": (_zstd_bomb, CorruptCheckpointError,
                  r"the chunk at \[3, 0\] in 'bomb.distcp' at \[0, \d+\): zstd frame decompresses to more than "
                  r"1048648 bytes, more than its item can hold", False),
    "unknown_transform": (_storage("model.wide", (0, 0), transform_descriptors=["stream.gzip/1"]), UnsupportedError,
                          r"item encoded as \['stream.gzip/1'\]; ckptfs reads only \['stream.zstd/1'\]", False),
    "planner_twice": (_planner("step", ("model", "wide")), CorruptCheckpointError,
                      r"planner_data path \['model', 'wide'\] is given twice", True),
    "planner_through_leaf": (_planner("step", ("model", "wide", "x")), CorruptCheckpointError,
                             r"planner_data path \['model', 'wide', 'x'\] passes through a Tensor at 'wide'", True),
    "planner_huge_index": (_planner("step", ("lst", 1 << 40)), CorruptCheckpointError,
                           r"planner_data path \['lst', 1099511627776\] has the list index 1099511627776", True),
    "metadata_truncated": (None, TruncatedPickleError, r"\.metadata: pickle truncated|pickle truncated", True),
    "planted_call": (None, CorruptCheckpointError, r"\.metadata: planner_data is a posix.system, not a dict", True),
}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    state = {"model": {"wide": torch.arange(42.0).reshape(7, 6), "bias": torch.ones(3)}, "step": 5}
    path = tmp_path_factory.mktemp("dcp_hostile") / "base"
    simulate_ranks(state, {"model.wide": (0, 3)}, path, world=3)
    return path


def _make(base: Path, target: Path, name: str, env: Env) -> Path:
    shutil.copytree(base, target)
    mutation = CASES[name][0]
    metadata = target / ".metadata"
    if name == "metadata_truncated":
        metadata.write_bytes(metadata.read_bytes()[:300])
    elif name == "planted_call":
        md = pickle.loads(metadata.read_bytes())
        md.planner_data = _Planted(env.canary)
        metadata.write_bytes(pickle.dumps(md))
    else:
        assert mutation is not None
        md = pickle.loads(metadata.read_bytes())
        mutation(target, md)
        metadata.write_bytes(pickle.dumps(md))
    return target


@pytest.mark.parametrize("name", CASES)
def test_open_and_read(name: str, base: Path, tmp_path: Path, env: Env) -> None:
    path = _make(base, tmp_path / name, name, env)
    _, error, reason, on_open = CASES[name]
    if on_open:
        with pytest.raises(CkptfsError) as info:
            ckptfs.open(path)
    else:
        with ckptfs.open(path) as ck, pytest.raises(CkptfsError) as info:
            for tensor in ck.tensors:
                ck.read(tensor, 0, 4096)
    assert type(info.value) is error, info.value
    assert_names_file(info.value, path, reason)
    assert not env.canary.exists()


@pytest.mark.parametrize("name", [n for n, case in CASES.items() if case[3]])
def test_cli(name: str, base: Path, tmp_path: Path, env: Env, runner: Runner) -> None:
    path = _make(base, tmp_path / name, name, env)
    for command in (("ls",), ("info", "--json")):
        result = runner.run(*command, path)
        assert_bounded(result)
        assert_cli_error(result, path, CASES[name][2])


def test_a_directory_of_other_files_is_not_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "x.metadata").write_bytes(pickle.dumps({"a": 1}))
    with pytest.raises(CkptfsError, match=re.escape(f"{tmp_path}: a directory, but no checkpoint directory: ")):
        ckptfs.open(tmp_path)


@pytest.mark.parametrize("target", [".metadata", "__1_0.distcp"])
def test_mutations_fail_cleanly(target: str, base: Path, tmp_path: Path, env: Env) -> None:
    """Byte flips, cuts and splices of the metadata pickle and of a chunk file: each opens and reads (the ends of
    every tensor, the whole description) or fails with a CkptfsError naming the directory."""
    import random

    from hostile.checks import exercise

    path = tmp_path / "mutant"
    shutil.copytree(base, path)
    original = (base / target).read_bytes()
    rng = random.Random(target)
    outcomes = {"opened": 0, "failed": 0}
    for _ in range(250):
        data = bytearray(original)
        kind = rng.randrange(3)
        if kind == 0:
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        elif kind == 1:
            del data[rng.randrange(len(data)):]
        else:
            at = rng.randrange(len(data))
            data[at:at] = data[rng.randrange(len(data)):][: rng.randint(1, 64)]
        (path / target).write_bytes(bytes(data))
        try:
            with ckptfs.open(path) as ck:
                exercise(ck)
                outcomes["opened"] += 1
        except CkptfsError as exc:
            assert exc.path == str(path), exc
            outcomes["failed"] += 1
    assert not env.canary.exists()
    assert outcomes["opened"] and outcomes["failed"], outcomes
