"""``.npy`` headers against numpy's own writer, and the ``.npy`` view of a layout against torch's bytes."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from corpus import save_zip, torch_bytes

import ckptfs
from ckptfs.fs.layout import Layout
from ckptfs.fs.npy import dtype_descr, npy_header
from ckptfs.fs.pieces import piece_bytes
from ckptfs.model.dtypes import DTYPES


@pytest.mark.parametrize("descr, shape", [
    ("<f4", (3, 4)), ("|b1", ()), ("<u2", (0,)), ("<c16", (1,) * 40), ("<i8", (10**20, 3)), ("|u1", (7,)),
    ("<f8", (2,) * 9000),  # header text just under 64 KiB: version 1.0
    ("<f8", (2,) * 30000),  # over 64 KiB: version 2.0
])
def test_header_is_numpys(descr: str, shape: tuple[int, ...]) -> None:
    written = io.BytesIO()
    fields = {"descr": descr, "fortran_order": False, "shape": shape}
    version_2 = len(shape) == 30000
    write = np.lib.format.write_array_header_2_0 if version_2 else np.lib.format.write_array_header_1_0
    write(written, fields)
    header = npy_header(descr, shape)
    assert header == written.getvalue()
    assert len(header) % 64 == 0 and header[6] == (2 if version_2 else 1)


def test_dtypes_without_numpy_are_raw_bits() -> None:
    assert dtype_descr(DTYPES["bfloat16"]) == ("<u2", True)
    assert dtype_descr(DTYPES["float8_e4m3fn"]) == ("|u1", True)
    assert dtype_descr(DTYPES["float4_e2m1fn_x2"]) == ("|u1", True)
    assert dtype_descr(DTYPES["complex32"]) == ("<u4", True)
    assert dtype_descr(DTYPES["float32"]) == ("<f4", False)
    assert dtype_descr(DTYPES["quint4x2"]) is None


def test_layout_npy_files(tmp_path: Path) -> None:
    base = torch.arange(12.0).reshape(3, 4)
    tensors = {"w": base, "t": base.t(), "s": torch.tensor(2.5), "e": torch.empty(0, 2),
               "b": torch.ones(3, dtype=torch.bfloat16), "q": torch.quantize_per_tensor(torch.ones(4), 0.1, 0,
                                                                                         torch.quint4x2)}
    path = save_zip({**tensors, "meta": torch.empty(2, device="meta")}, tmp_path / "t.pt")
    with ckptfs.open(path) as ck:
        layout = Layout(ck)
        for name, t in tensors.items():
            node = layout.lookup(f"/{name}.npy")
            sidecar = json.loads(layout.content(layout.lookup(f"/{name}.json")))  # type: ignore[arg-type]
            if name == "q":
                assert node is None and sidecar["npy"] is None
                continue
            assert node is not None
            pieces = layout.pieces(node)
            data = b"".join(piece_bytes(piece, ck.read) for piece in pieces)
            assert layout.size(node) == len(data)
            array = np.load(io.BytesIO(data))
            assert array.shape == t.shape and array.tobytes() == torch_bytes(t)
            if name == "b":
                assert sidecar["npy"] == {"descr": "<u2", "raw_bits_of": "bfloat16"}
                assert np.array_equal(array, t.view(torch.int16).numpy().view(np.uint16))
            else:
                assert sidecar["npy"] == {"descr": array.dtype.str} and np.array_equal(array, t.numpy())
        assert layout.lookup("/meta.npy") is None
