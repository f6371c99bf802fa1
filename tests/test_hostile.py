"""Spec §8.4 / R13: hostile pickles wrapped as torch archives open inertly and quickly, or fail cleanly."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from corpus import save_zip, write_raw_archive
from counting import CountingSource

import ckptfs
from ckptfs.errors import LimitExceededError, UnpicklingError
from ckptfs.fs.describe import encode_tree
from ckptfs.pickle.values import Global, PickledObject
from ckptfs.sources import open_source

HANG_SECONDS = 60.0
"""A guard against hangs only, far above the ~0.1 s any of these takes: their work is bounded by counts (reads,
bytes, the limit hit), which do not drift with the machine's load as time, even CPU time, does."""
OPEN_READS = 3
"""Reads that open a torch.save zip, whatever its size (two; three when its central directory is large)."""


def open_quickly(path: Path, limits: ckptfs.Limits = ckptfs.Limits()) -> ckptfs.Checkpoint:
    """Opened in a few reads of at most the file's bytes, and described, however hostile the pickle."""
    start = time.monotonic()
    source = CountingSource(open_source(path))
    ck = ckptfs.open(source, limits)
    json.dumps(encode_tree(ck.root))
    assert len(source.reads) <= OPEN_READS and source.bytes_read <= source.size, source.reads
    assert time.monotonic() - start < HANG_SECONDS
    return ck


class CallsGetcwd:
    def __reduce__(self) -> tuple[Any, ...]:
        return os.getcwd, ()


def test_reduce_of_a_harmless_callable_stays_a_description(tmp_path: Path) -> None:
    path = save_zip({"w": torch.arange(3.0), "cwd": CallsGetcwd()}, tmp_path / "getcwd.pt")
    with pytest.raises(Exception, match="getcwd"):
        torch.load(path, weights_only=True)
    with open_quickly(path) as ck:
        cwd = ck.root["cwd"]
        assert isinstance(cwd, PickledObject) and cwd.callable == Global(os.getcwd.__module__, "getcwd")
        assert cwd.args == ()
        assert [t.path for t in ck.tensors] == [("w",)]
        assert ck.read(ck.tensors[0]) == torch.arange(3.0).numpy().tobytes()


def test_command_in_data_pkl_never_runs(tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    command = f"touch {canary}".encode()
    data = b"\x80\x02cos\nsystem\nX" + len(command).to_bytes(4, "little") + command + b"\x85R."
    with open_quickly(write_raw_archive(tmp_path / "system.pt", data)) as ck:
        assert isinstance(ck.root, PickledObject) and ck.root.args == (command.decode(),)
    assert not canary.exists()


def test_list_containing_itself(tmp_path: Path) -> None:
    path = write_raw_archive(tmp_path / "cycle.pt", b"\x80\x02]q\x00h\x00a.")
    with open_quickly(path) as ck:
        assert ck.root[0] is ck.root and ck.tensors == []
        assert encode_tree(ck.root) == [{"$ref": []}]


def test_forty_level_dag_of_one_tensor(tmp_path: Path) -> None:
    """2**40 paths lead to the tensor; it is listed once, at its first path."""
    x: Any = torch.arange(4, dtype=torch.int32)
    for _ in range(40):
        x = [x, x]
    path = save_zip(x, tmp_path / "dag.pt")
    assert path.stat().st_size < 4096
    with open_quickly(path) as ck:
        (tensor,) = ck.tensors
        assert tensor.path == (0,) * 40
        assert ck.tensor((0,) * 40) is tensor and ck.tensor((0,) * 39 + (1,)) is tensor
        assert ck.read(tensor) == torch.arange(4, dtype=torch.int32).numpy().tobytes()


def test_memo_index_near_two_to_the_31(tmp_path: Path) -> None:
    # CPython's C unpickler would size its memo array to the index (many GiB).
    index = (0x7FFFFFFE).to_bytes(4, "little")
    path = write_raw_archive(tmp_path / "memo.pt", b"\x80\x02]r" + index + b"j" + index + b"\x86.")
    with open_quickly(path) as ck:
        assert ck.root == ([], []) and ck.root[0] is ck.root[1]


def test_memo_entry_limit(tmp_path: Path) -> None:
    body = b"".join(b"N" + b"r" + i.to_bytes(4, "little") + b"0" for i in range(0, 2000, 3))
    path = write_raw_archive(tmp_path / "memo_many.pt", b"\x80\x02" + body + b"N.")
    with pytest.raises(LimitExceededError, match="memo exceeds 100 entries"):
        ckptfs.open(path, ckptfs.Limits(max_memo_entries=100))


def test_deep_nesting_fails_cleanly(tmp_path: Path) -> None:
    depth = 100_000
    path = write_raw_archive(tmp_path / "deep.pt", b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b".")
    start = time.monotonic()
    with pytest.raises(LimitExceededError, match="nests deeper than 1000") as info:
        ckptfs.open(path)
    assert time.monotonic() - start < HANG_SECONDS  # the work is bounded by the limit hit
    assert str(info.value).startswith(f"{path}: ")


def test_string_length_lie(tmp_path: Path) -> None:
    path = write_raw_archive(tmp_path / "lie.pt", b"\x80\x04\x8d" + (2**62).to_bytes(8, "little") + b"abc.")
    with pytest.raises(UnpicklingError, match="truncated"):
        ckptfs.open(path)


def test_huge_expanded_tensor_reads_in_ranges(tmp_path: Path) -> None:
    """Stride 0 makes a 4 EiB logical tensor out of one stored float; ranged reads stay cheap."""
    path = save_zip({"x": torch.tensor([1.5]).expand(2**40, 2**20)}, tmp_path / "huge.pt")
    element = torch.tensor([1.5]).numpy().tobytes()
    with open_quickly(path) as ck:
        (tensor,) = ck.tensors
        assert (tensor.stride, tensor.nbytes) == ((0, 0), 2**62)
        source = ck.source
        assert isinstance(source, CountingSource)
        opened = len(source.reads)
        assert ck.read(tensor, 2**61 + 4, 1 << 16) == element * (1 << 14)
        assert ck.read(tensor, tensor.nbytes - 6, 100) == element[-2:] + element
        header, *floats = source.reads[opened:]  # the record's local header, checked on its first read
        assert floats == [(floats[0][0], 4)] * 2 and header[1] < 1024  # the one stored float, once a read
