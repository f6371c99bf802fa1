"""``.npy`` headers: the bytes numpy's ``np.save`` writes before an array's data, made from a dtype and a shape.

The layout is numpy's (``numpy.lib.format``): the magic ``\\x93NUMPY``, the
version, the header's length (2 bytes little-endian in version 1.0, 4 in 2.0,
used only when the text does not fit in 65,535 bytes), then the text
``{'descr': …, 'fortran_order': False, 'shape': (…), }``, padded with spaces
(and room for the first axis to grow to 21 digits, as numpy leaves) so that the
data starts at a multiple of 64 bytes, and a newline.

Which dtype a tensor's ``.npy`` has (``npy_dtype``): numpy's equivalent of its
dtype where numpy has one; where numpy has none (bfloat16, the float8 and
float4 types, complex32, torch's bits types) the raw bits as an unsigned
integer of the same width (``<u2``, ``|u1``, ``<u4``), the true dtype in the
sidecar's ``npy`` field. Tensors without data and packed quantized types
(quint4x2, quint2x4: their bytes are not one element each) have no ``.npy``.
"""

from __future__ import annotations

import struct

from ckptfs.model.dtypes import DType
from ckptfs.model.records import Tensor

MAGIC = b"\x93NUMPY"
ALIGNMENT = 64
GROWTH_AXIS_MAX_DIGITS = 21
"""numpy pads the header so that the first axis can grow to this many digits in place."""
_RAW_BITS = {1: "|u1", 2: "<u2", 4: "<u4"}


def npy_dtype(tensor: Tensor) -> tuple[str, bool] | None:
    """The ``descr`` of the tensor's ``.npy`` and whether it holds raw bits of another dtype; None: no ``.npy``."""
    if not tensor.has_data:
        return None
    return dtype_descr(tensor.dtype)


def dtype_descr(dtype: DType) -> tuple[str, bool] | None:
    if dtype.packing > 1:
        return None
    if dtype.numpy is not None:
        return dtype.numpy, False
    raw = _RAW_BITS.get(dtype.itemsize)
    return None if raw is None else (raw, True)


def npy_header(descr: str, shape: tuple[int, ...]) -> bytes:
    """The header ``np.save`` writes for a C-ordered array of this dtype and shape (version 1.0, or 2.0 when
    the text needs it)."""
    shape_text = repr(tuple(shape))
    text = "{'descr': %r, 'fortran_order': False, 'shape': %s, }" % (descr, shape_text)
    if shape:
        text += " " * (GROWTH_AXIS_MAX_DIGITS - len(repr(shape[0])))
    raw = text.encode("latin1")
    for version, length_format in ((1, "<H"), (2, "<I")):
        prefix = len(MAGIC) + 2 + struct.calcsize(length_format)
        padding = -(prefix + len(raw) + 1) % ALIGNMENT
        length = len(raw) + padding + 1
        if length < 1 << (8 * struct.calcsize(length_format)):
            return MAGIC + bytes((version, 0)) + struct.pack(length_format, length) + raw + b" " * padding + b"\n"
    raise ValueError(f"an .npy header for shape {shape_text} would exceed 4 GiB")
