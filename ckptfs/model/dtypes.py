"""Tensor element types: torch names, element sizes, numpy equivalents, storage classes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    name: str
    """Canonical torch name without the ``torch.`` prefix, e.g. ``bfloat16``."""
    itemsize: int
    numpy: str | None
    """numpy dtype string of the bytes ckptfs serves (always little-endian), or None."""
    swap_unit: int
    """Bytes per byte-swapped unit when the source is big-endian (1 = never swapped)."""
    storage_class: str
    """Storage class name the TorchScript pickler writes (``FloatStorage`` …)."""
    is_complex: bool = False
    is_quantized: bool = False
    packing: int = 1
    """Logical elements per stored byte (2 for quint4x2, 4 for quint2x4)."""


DTYPES: dict[str, DType] = {
    d.name: d
    for d in (
        DType("float64", 8, "<f8", 8, "DoubleStorage"),
        DType("float32", 4, "<f4", 4, "FloatStorage"),
        DType("float16", 2, "<f2", 2, "HalfStorage"),
        DType("bfloat16", 2, None, 2, "BFloat16Storage"),
        DType("complex128", 16, "<c16", 8, "ComplexDoubleStorage", is_complex=True),
        DType("complex64", 8, "<c8", 4, "ComplexFloatStorage", is_complex=True),
        DType("complex32", 4, None, 2, "ComplexHalfStorage", is_complex=True),
        DType("int64", 8, "<i8", 8, "LongStorage"),
        DType("int32", 4, "<i4", 4, "IntStorage"),
        DType("int16", 2, "<i2", 2, "ShortStorage"),
        DType("int8", 1, "|i1", 1, "CharStorage"),
        DType("uint8", 1, "|u1", 1, "ByteStorage"),
        DType("bool", 1, "|b1", 1, "BoolStorage"),
        DType("uint16", 2, "<u2", 2, "UInt16Storage"),
        DType("uint32", 4, "<u4", 4, "UInt32Storage"),
        DType("uint64", 8, "<u8", 8, "UInt64Storage"),
        DType("float8_e4m3fn", 1, None, 1, "Float8_e4m3fnStorage"),
        DType("float8_e5m2", 1, None, 1, "Float8_e5m2Storage"),
        DType("float8_e4m3fnuz", 1, None, 1, "Float8_e4m3fnuzStorage"),
        DType("float8_e5m2fnuz", 1, None, 1, "Float8_e5m2fnuzStorage"),
        DType("float8_e8m0fnu", 1, None, 1, "Float8_e8m0fnuStorage"),
        DType("float4_e2m1fn_x2", 1, None, 1, "Float4_e2m1fn_x2Storage"),
        DType("bits8", 1, None, 1, "Bits8Storage"),
        DType("bits16", 2, None, 2, "Bits16Storage"),
        DType("bits1x8", 1, None, 1, "Bits1x8Storage"),
        DType("bits2x4", 1, None, 1, "Bits2x4Storage"),
        DType("bits4x2", 1, None, 1, "Bits4x2Storage"),
        DType("qint8", 1, "|i1", 1, "QInt8Storage", is_quantized=True),
        DType("quint8", 1, "|u1", 1, "QUInt8Storage", is_quantized=True),
        DType("qint32", 4, "<i4", 4, "QInt32Storage", is_quantized=True),
        DType("quint4x2", 1, None, 1, "QUInt4x2Storage", is_quantized=True, packing=2),
        DType("quint2x4", 1, None, 1, "QUInt2x4Storage", is_quantized=True, packing=4),
    )
}

UNTYPED = DType("untyped", 1, "|u1", 1, "UntypedStorage")
"""Element type of ``UntypedStorage`` records: plain bytes."""

_ALIASES = {
    "float": "float32",
    "double": "float64",
    "half": "float16",
    "cfloat": "complex64",
    "cdouble": "complex128",
    "chalf": "complex32",
    "long": "int64",
    "int": "int32",
    "short": "int16",
    "uint": "uint32",
}

_STORAGE_CLASSES: dict[str, DType] = {d.storage_class: d for d in DTYPES.values()}
_STORAGE_CLASSES["UntypedStorage"] = UNTYPED


def dtype_by_name(name: str) -> DType | None:
    """The dtype for a torch global name (``float32``, ``torch.float32``, alias ``half``)."""
    name = name.removeprefix("torch.")
    return DTYPES.get(_ALIASES.get(name, name))


def dtype_of_storage_class(module: str, name: str) -> DType | None:
    """The element type of a storage class global (``torch FloatStorage`` …), or None.

    CUDA classes (``torch.cuda.FloatStorage``) and ``torch.UntypedStorage`` are
    accepted as aliases; ``TypedStorage`` carries no dtype and gives None.
    """
    if module not in ("torch", "torch.cuda", "torch.storage"):
        return None
    return _STORAGE_CLASSES.get(name)
