"""Sidecars of DCP tensors (``fs.chunk_sidecar``'s families for one chunk in a file, the rest rendered whole) are
``json.dumps(tensor_metadata(t))``, and their sizes, in bulk and one by one, are those texts' lengths."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hostile.test_cscan_dcp import torch_written

import ckptfs
import ckptfs.fs.sidecar
from ckptfs.fs.describe import tensor_metadata
from ckptfs.fs.sidecar import SidecarMaker
from ckptfs.model.records import Chunk, Tensor


def check(tensors: list[Tensor], monkeypatch: pytest.MonkeyPatch) -> None:
    for bulk in (0, 64):
        monkeypatch.setattr(ckptfs.fs.sidecar, "_BULK", bulk)
        make = SidecarMaker()
        texts = [make(t) for t in tensors]
        assert texts == [(json.dumps(tensor_metadata(t)) + "\n").encode() for t in tensors]
        assert make.sizes(tensors) == [len(text) for text in texts]
        assert [SidecarMaker().size(t) for t in tensors] == [len(text) for text in texts]


def test_dcp_sidecars_are_tensor_metadata(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, path in torch_written(tmp_path).items():
        with ckptfs.open(path) as ck:
            tensors = ck.tensors
            assert any(t.chunks and len(t.chunks) == 1 for t in tensors), name
            check(tensors * 2, monkeypatch)


def test_chunks_far_into_their_files_and_transformed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranges past what the bulk count takes (2**62), and chunks alike but for their transforms or file."""
    with ckptfs.open(torch_written(tmp_path)["plain"]) as ck:
        tensors = [t for t in ck.tensors if t.chunks and len(t.chunks) == 1]
        for n, tensor in enumerate(tensors):
            chunk = tensor.chunks[0]  # type: ignore[index]
            start = (1 << 62) - 3 + n if n % 2 else chunk.start
            tensor.chunks = [Chunk(chunk.offsets, chunk.sizes, "other" if n % 3 == 0 else chunk.file, start,
                                   chunk.length, ("stream.zstd/1",) if n % 4 == 0 else ())]
        check(tensors * 2, monkeypatch)


def test_chunk_families_know_every_field() -> None:
    """A chunk's fields are in its family (offsets, sizes, file, transforms) or filled in (start, length); its
    ``tensor`` is only shown for a shard (no file), which has no family."""
    assert [f.name for f in dataclasses.fields(Chunk)] == [
        "offsets", "sizes", "file", "start", "length", "transforms", "tensor"]
