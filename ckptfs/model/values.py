"""Known pickle calls that make plain values: containers, builtins, torch.Size and devices, numpy arrays and scalars."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ckptfs.pickle.values import Buildable, Global, Handler, PickledObject, hashable_key


@dataclass(eq=False, slots=True)
class NumpyArray(Buildable):
    """A numpy array pickled inline; its raw bytes come with BUILD."""

    dtype: str = ""
    shape: tuple[int, ...] = ()
    fortran_order: bool = False
    data: bytes | None = None

    def apply_state(self, state: Any) -> None:
        if not (isinstance(state, tuple) and len(state) == 5):
            return
        _, shape, dtype, fortran, raw = state
        if isinstance(shape, tuple) and all(type(n) is int and n >= 0 for n in shape):
            self.shape = shape
        if isinstance(dtype, NumpyDType):
            self.dtype = dtype.descr
        self.fortran_order = bool(fortran)
        if isinstance(raw, (bytes, bytearray)):
            self.data = bytes(raw)
        elif isinstance(raw, str):
            self.data = raw.encode("latin-1", "replace")


@dataclass(eq=False, slots=True)
class NumpyDType(Buildable):
    """``numpy.dtype(...)`` as pickled: a type string completed by BUILD's byte order."""

    code: str
    byteorder: str = "|"

    def apply_state(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) > 1 and state[1] in ("<", ">", "|", "="):
            self.byteorder = state[1]

    @property
    def descr(self) -> str:
        if self.code[:1] in "<>|=":
            return self.code
        return self.byteorder + self.code


_NUMPY_SCALAR_CODE = re.compile(r"^[<>|=]?(?:[biuf][1248]|c(?:8|16)|f16|\?)$")


def _ordered_dict(args: tuple[Any, ...]) -> Any:
    if not args:
        return {}
    return _dict_from_pairs(args[0])


def _dict_from_pairs(pairs: Any) -> Any:
    if isinstance(pairs, dict):
        return dict(pairs)
    if isinstance(pairs, list) and all(isinstance(p, (tuple, list)) and len(p) == 2 for p in pairs):
        return {hashable_key(k): v for k, v in pairs}
    return PickledObject(Global("collections", "OrderedDict"), (pairs,))


def _set(kind: type) -> Handler:
    def handler(args: tuple[Any, ...]) -> Any:
        items = args[0] if args else []
        if isinstance(items, (list, tuple, set, frozenset)):
            return kind(hashable_key(v) for v in items)
        return PickledObject(Global("builtins", kind.__name__), args)

    return handler


def _complex(args: tuple[Any, ...]) -> Any:
    if len(args) == 2 and all(type(a) in (int, float) for a in args):
        return complex(args[0], args[1])
    return PickledObject(Global("builtins", "complex"), args)


def _bytearray(args: tuple[Any, ...]) -> Any:
    if not args:
        return bytearray()
    if isinstance(args[0], (bytes, bytearray)):
        return bytearray(args[0])
    if len(args) == 2 and isinstance(args[0], str) and args[1] == "latin-1":
        return bytearray(args[0].encode("latin-1", "replace"))
    return PickledObject(Global("builtins", "bytearray"), args)


def _bytes(args: tuple[Any, ...]) -> Any:
    # Protocols 0-2 pickle b"" as a call of bytes() with no arguments.
    if not args:
        return b""
    return PickledObject(Global("builtins", "bytes"), args)


def _codecs_encode(args: tuple[Any, ...]) -> Any:
    if len(args) == 2 and isinstance(args[0], str) and args[1] in ("latin1", "latin-1"):
        return args[0].encode("latin-1", "replace")
    return PickledObject(Global("_codecs", "encode"), args)


def _torch_size(args: tuple[Any, ...]) -> Any:
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        return tuple(args[0])
    return PickledObject(Global("torch", "Size"), args)


def _torch_device(args: tuple[Any, ...]) -> Any:
    if len(args) == 1 and isinstance(args[0], str):
        return Global("torch.device", args[0])
    if len(args) == 2 and isinstance(args[0], str) and type(args[1]) is int:
        return Global("torch.device", f"{args[0]}:{args[1]}")
    return PickledObject(Global("torch", "device"), args)


def _layout(args: tuple[Any, ...]) -> Any:
    if len(args) == 1 and isinstance(args[0], str):
        return args[0]
    return PickledObject(Global("torch.serialization", "_get_layout"), args)


def _first_argument(args: tuple[Any, ...]) -> Any:
    return args[0] if args else None


def _numpy_reconstruct(args: tuple[Any, ...]) -> NumpyArray:
    return NumpyArray()


def _numpy_dtype(args: tuple[Any, ...]) -> Any:
    if args and isinstance(args[0], str):
        return NumpyDType(args[0])
    return PickledObject(Global("numpy", "dtype"), args)


def _numpy_scalar(args: tuple[Any, ...]) -> Any:
    if len(args) == 2 and isinstance(args[0], NumpyDType):
        raw = args[1]
        if isinstance(raw, str):
            raw = raw.encode("latin-1", "replace")
        descr = args[0].descr
        if isinstance(raw, bytes) and _NUMPY_SCALAR_CODE.match(descr):
            import numpy as np

            dtype = np.dtype(descr)
            if len(raw) == dtype.itemsize:
                return np.frombuffer(raw, dtype=dtype)[0].item()
    return PickledObject(Global("numpy.core.multiarray", "scalar"), args)


VALUE_HANDLERS: dict[tuple[str, str], Handler] = {
    ("collections", "OrderedDict"): _ordered_dict,
    ("collections", "Counter"): _ordered_dict,
    ("builtins", "set"): _set(set),
    ("builtins", "frozenset"): _set(frozenset),
    ("builtins", "complex"): _complex,
    ("builtins", "bytearray"): _bytearray,
    ("builtins", "bytes"): _bytes,
    ("_codecs", "encode"): _codecs_encode,
    ("torch", "Size"): _torch_size,
    ("torch", "device"): _torch_device,
    ("torch.serialization", "_get_layout"): _layout,
    **{
        ("torch.jit._pickle", name): _first_argument
        for name in (
            "build_intlist",
            "build_tensorlist",
            "build_doublelist",
            "build_boollist",
            "build_complexlist",
            "build_tensor_from_id",
            "restore_type_tag",
        )
    },
    **{(m, "_reconstruct"): _numpy_reconstruct for m in ("numpy.core.multiarray", "numpy._core.multiarray")},
    **{(m, "scalar"): _numpy_scalar for m in ("numpy.core.multiarray", "numpy._core.multiarray")},
    ("numpy", "dtype"): _numpy_dtype,
}
