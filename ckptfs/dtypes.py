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

    @property
    def torch_name(self) -> str:
        return f"torch.{self.name}"


def _d(name: str, size: int, numpy: str | None, swap: int, cls: str, **kw: bool | int) -> DType:
    return DType(name, size, numpy, swap, cls, **kw)


DTYPES: dict[str, DType] = {
    d.name: d
    for d in (
        _d("float64", 8, "<f8", 8, "DoubleStorage"),
        _d("float32", 4, "<f4", 4, "FloatStorage"),
        _d("float16", 2, "<f2", 2, "HalfStorage"),
        _d("bfloat16", 2, None, 2, "BFloat16Storage"),
        _d("complex128", 16, "<c16", 8, "ComplexDoubleStorage", is_complex=True),
        _d("complex64", 8, "<c8", 4, "ComplexFloatStorage", is_complex=True),
        _d("complex32", 4, None, 2, "ComplexHalfStorage", is_complex=True),
        _d("int64", 8, "<i8", 8, "LongStorage"),
        _d("int32", 4, "<i4", 4, "IntStorage"),
        _d("int16", 2, "<i2", 2, "ShortStorage"),
        _d("int8", 1, "|i1", 1, "CharStorage"),
        _d("uint8", 1, "|u1", 1, "ByteStorage"),
        _d("bool", 1, "|b1", 1, "BoolStorage"),
        _d("uint16", 2, "<u2", 2, "UInt16Storage"),
        _d("uint32", 4, "<u4", 4, "UInt32Storage"),
        _d("uint64", 8, "<u8", 8, "UInt64Storage"),
        _d("float8_e4m3fn", 1, None, 1, "Float8_e4m3fnStorage"),
        _d("float8_e5m2", 1, None, 1, "Float8_e5m2Storage"),
        _d("float8_e4m3fnuz", 1, None, 1, "Float8_e4m3fnuzStorage"),
        _d("float8_e5m2fnuz", 1, None, 1, "Float8_e5m2fnuzStorage"),
        _d("float8_e8m0fnu", 1, None, 1, "Float8_e8m0fnuStorage"),
        _d("float4_e2m1fn_x2", 1, None, 1, "Float4_e2m1fn_x2Storage"),
        _d("bits8", 1, None, 1, "Bits8Storage"),
        _d("bits16", 2, None, 2, "Bits16Storage"),
        _d("bits1x8", 1, None, 1, "Bits1x8Storage"),
        _d("bits2x4", 1, None, 1, "Bits2x4Storage"),
        _d("bits4x2", 1, None, 1, "Bits4x2Storage"),
        _d("qint8", 1, "|i1", 1, "QInt8Storage", is_quantized=True),
        _d("quint8", 1, "|u1", 1, "QUInt8Storage", is_quantized=True),
        _d("qint32", 4, "<i4", 4, "QInt32Storage", is_quantized=True),
        _d("quint4x2", 1, None, 1, "QUInt4x2Storage", is_quantized=True, packing=2),
        _d("quint2x4", 1, None, 1, "QUInt2x4Storage", is_quantized=True, packing=4),
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
