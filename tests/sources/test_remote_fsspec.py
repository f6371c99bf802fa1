"""Other fsspec URLs go through fsspec: its in-memory file system stands in for gs://, az://, hf:// ..."""

from __future__ import annotations

import io

import pytest
import torch

import ckptfs
from ckptfs.errors import SourceError
from ckptfs.sources import RemoteOptions, open_source

fsspec = pytest.importorskip("fsspec")


def test_a_checkpoint_in_an_fsspec_file_system_reads_as_torch_wrote_it() -> None:
    tensors = {"w": torch.randn(50, 7, generator=torch.Generator().manual_seed(1)), "i": torch.arange(9)}
    buffer = io.BytesIO()
    torch.save(tensors, buffer)
    fs = fsspec.filesystem("memory")
    fs.pipe("/ckpts/model.pt", buffer.getvalue())
    with ckptfs.open("memory://ckpts/model.pt") as ck:
        assert {t.path[0]: ck.read(t) for t in ck} == {k: v.numpy().tobytes() for k, v in tensors.items()}
        assert ck.source.stat().size == len(buffer.getvalue())
    with pytest.raises(SourceError, match=r"^memory://ckpts/missing\.pt: no such object$"):
        open_source("memory://ckpts/missing.pt")
    with pytest.raises(SourceError, match=r"read of 10 bytes at offset .* is outside the object"):
        open_source("memory://ckpts/model.pt", RemoteOptions()).read(len(buffer.getvalue()) - 5, 10)
