"""A state dict of many small tensors named like a mixture-of-experts model's, as torch.save writes it: the
shape of checkpoint the metadata cache is for (``ckptfs.cache.MIN_TENSORS`` and more)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int8)


def save_many(path: Path, count: int) -> Path:
    gen = torch.Generator().manual_seed(count)
    state = {}
    for i in range(count):
        values = torch.randint(-100, 100, (2, 3), generator=gen)
        state[f"model.layers.{i // 48}.mlp.experts.{i // 3 % 16}.w{i % 3 + 1}.weight"] = values.to(DTYPES[i % 4])
    torch.save(state, path)
    return path


@pytest.fixture
def small_zips_cached() -> Iterator[None]:
    """Commands the test runs parse on the reference path, where a local zip of ``MIN_TENSORS`` is cached: with
    the compiled scanner, local zips are cached only from ``ckptfs.cache.MIN_TENSORS_SCANNED`` tensors on."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CKPTFS_PICKLE_COMPILED", "0")
        yield
