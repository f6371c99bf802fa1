"""Views through real mounts: ``NAME.npy`` read by numpy, against torch's values."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from corpus import CORPUS_NAMES, CorpusFile, torch_bytes

from mount.helpers import tensor_file

pytestmark = pytest.mark.mount


def torch_values(t: torch.Tensor) -> np.ndarray | None:
    if t.is_quantized:
        t = t.int_repr()
    try:
        return t.detach().resolve_conj().resolve_neg().numpy()
    except TypeError:
        return None


@pytest.mark.parametrize("name", CORPUS_NAMES)
def test_npy_loads_as_torch_values(corpus: dict[str, CorpusFile], corpus_mounts: dict[str, Path], name: str) -> None:
    loaded = 0
    for path, t in corpus[name].expected.tensors.items():
        f = tensor_file(corpus_mounts[name], path)
        npy = Path(f"{f}.npy")
        meta = json.loads(Path(f"{f}.json").read_text())
        if t.is_meta or t.dtype in (torch.quint4x2, torch.quint2x4):
            assert meta["npy"] is None and not npy.exists(), path
            continue
        size = os.stat(npy).st_size
        array = np.load(npy, mmap_mode="r") if t.numel() else np.load(npy)
        assert size == len(npy.read_bytes()), path
        assert array.shape == t.shape and array.dtype.str == meta["npy"]["descr"], path
        assert array.tobytes() == torch_bytes(t), path
        values = torch_values(t)
        if "raw_bits_of" in meta["npy"]:
            assert meta["npy"]["raw_bits_of"] == meta["dtype"] and array.dtype.kind == "u", path
        elif values is not None:
            assert np.array_equal(array, values, equal_nan=array.dtype.kind in "fc"), path
        loaded += 1
    assert loaded > 0
