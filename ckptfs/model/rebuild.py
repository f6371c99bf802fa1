"""Known pickle calls, interpreted by name into ckptfs records; nothing is imported.

``resolve`` maps a :class:`Global` to a handler of ckptfs' own. It covers torch's
``_rebuild_*`` functions (spec §2.3), container and value types that torch
checkpoints use, numpy arrays and scalars, and TorchScript's ``_pickle``
helpers. Names outside this table stay inert :class:`PickledObject` nodes.
"""

from __future__ import annotations

import math
import operator
import re
from typing import Any, Callable

from ckptfs.errors import CorruptCheckpointError
from ckptfs.model.dtypes import DTYPES, DType, dtype_by_name, dtype_of_storage_class
from ckptfs.model.records import NestedTensor, Quantization, SparseTensor, Storage, Tensor, contiguous_strides
from ckptfs.model.sharded import with_whole_tensor
from ckptfs.model.values import VALUE_HANDLERS, NumpyArray
from ckptfs.pickle.values import Buildable, Global, Handler, PickledObject, short_repr

MAX_RANK = 64
MAX_ELEMENTS = 1 << 62
INT64_END = 1 << 63
"""Sizes, strides and offsets are int64 in torch; larger ones are refused before any arithmetic."""

_NUMPY_SCALAR_CODE = re.compile(r"^[<>|=]?(?:[biuf][1248]|c(?:8|16)|f16|\?)$")


def _corrupt(message: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(message)


def _int(value: Any, what: str) -> int:
    if type(value) is not int:
        raise _corrupt(f"{what} must be an integer, got {type(value).__name__}")
    return value


def _dims(value: Any, what: str) -> tuple[int, ...]:
    if type(value) is tuple and len(value) <= MAX_RANK:
        for v in value:
            if type(v) is not int or not 0 <= v < INT64_END:
                break
        else:
            return value
    return _checked_dims(value, what)


def _checked_dims(value: Any, what: str) -> tuple[int, ...]:
    """``_dims`` off its fast path: converts lists and says what is wrong."""
    if not isinstance(value, (tuple, list)):
        raise _corrupt(f"tensor {what} must be a tuple, got {type(value).__name__}")
    if len(value) > MAX_RANK:
        raise _corrupt(f"tensor {what} has {len(value)} dimensions (limit {MAX_RANK})")
    dims = tuple(_int(v, f"tensor {what} entry") for v in value)
    if any(d < 0 for d in dims):
        raise _corrupt(f"tensor {what} {dims} has a negative entry")
    if any(d >= INT64_END for d in dims):
        raise _corrupt(f"tensor {what} {short_repr(dims)} has an entry beyond int64")
    return dims


def _dtype(value: Any) -> DType:
    if isinstance(value, Global) and value.module == "torch":
        dtype = dtype_by_name(value.name)
        if dtype is not None:
            return dtype
    raise _corrupt(f"unknown tensor dtype {short_repr(value)}")


def _storage(value: Any) -> Storage:
    if not isinstance(value, Storage):
        raise _corrupt(f"tensor storage must be a storage reference, got {type(value).__name__}")
    return value


def make_tensor(
    storage: Storage | None,
    offset: Any,
    shape: Any,
    stride: Any,
    dtype: DType,
    requires_grad: Any = False,
    kind: str = "dense",
) -> Tensor:
    """A validated tensor view: sizes, strides and offset must fit in the storage."""
    shape_t = _dims(shape, "size")
    stride_t = _dims(stride, "stride")
    if len(shape_t) != len(stride_t):
        raise _corrupt(f"tensor size {shape_t} and stride {stride_t} differ in rank")
    offset_i = offset if type(offset) is int else _int(offset, "storage offset")
    if offset_i < 0:
        raise _corrupt(f"negative storage offset {offset_i}")
    if offset_i >= INT64_END:
        raise _corrupt(f"storage offset {short_repr(offset_i)} is beyond int64")
    numel = math.prod(shape_t)
    if numel > MAX_ELEMENTS:
        raise _corrupt(f"tensor of size {shape_t} has more than 2**62 elements")
    tensor = Tensor(dtype, shape_t, stride_t, offset_i, storage, requires_grad is True or bool(requires_grad),
                    False, kind)
    if storage is not None and numel > 0:
        last = offset_i + sum(map(operator.mul, shape_t, stride_t)) - sum(stride_t)  # Σ (n - 1)·s, every n ≥ 1
        needed = -(-(last + 1) // dtype.packing) * dtype.itemsize
        if needed > storage.nbytes:
            raise _corrupt(
                f"tensor of size {shape_t}, stride {stride_t}, offset {offset_i} ({dtype.name}) "
                f"needs {needed} bytes but storage {storage.key!r} holds {storage.nbytes}"
            )
    return tensor


def _apply_metadata(tensor: Tensor, metadata: Any) -> Tensor:
    if isinstance(metadata, dict) and metadata:
        tensor.conj = bool(metadata.get("conj", False))
        tensor.neg = bool(metadata.get("neg", False))
    return tensor


def _rebuild_tensor(args: tuple[Any, ...]) -> Tensor:
    if len(args) != 4:
        raise _corrupt(f"_rebuild_tensor takes 4 arguments, got {len(args)}")
    storage = _storage(args[0])
    if storage.dtype.name == "untyped":
        raise _corrupt("_rebuild_tensor on an untyped storage has no dtype")
    return make_tensor(storage, args[1], args[2], args[3], storage.dtype)


def _rebuild_tensor_v2(args: tuple[Any, ...]) -> Tensor:
    if len(args) not in (6, 7):
        raise _corrupt(f"_rebuild_tensor_v2 takes 6 or 7 arguments, got {len(args)}")
    storage = _storage(args[0])
    if storage.dtype.name == "untyped":
        raise _corrupt("_rebuild_tensor_v2 on an untyped storage has no dtype")
    tensor = make_tensor(storage, args[1], args[2], args[3], storage.dtype, args[4])
    return _apply_metadata(tensor, args[6] if len(args) == 7 else None)


def _rebuild_tensor_v3(args: tuple[Any, ...]) -> Tensor:
    if len(args) not in (7, 8):
        raise _corrupt(f"_rebuild_tensor_v3 takes 7 or 8 arguments, got {len(args)}")
    tensor = make_tensor(_storage(args[0]), args[1], args[2], args[3], _dtype(args[6]), args[4])
    return _apply_metadata(tensor, args[7] if len(args) == 8 else None)


def _rebuild_parameter(args: tuple[Any, ...]) -> Any:
    if len(args) not in (3, 4):
        raise _corrupt(f"_rebuild_parameter takes 3 or 4 arguments, got {len(args)}")
    tensor = args[0]
    if isinstance(tensor, Tensor):
        tensor.is_parameter = True
        tensor.requires_grad = bool(args[1])
    return tensor


def _rebuild_qtensor(args: tuple[Any, ...]) -> Tensor:
    if len(args) != 7:
        raise _corrupt(f"_rebuild_qtensor takes 7 arguments, got {len(args)}")
    storage = _storage(args[0])
    tensor = make_tensor(storage, args[1], args[2], args[3], storage.dtype, args[5])
    if not storage.dtype.is_quantized:
        raise _corrupt(f"_rebuild_qtensor on a {storage.dtype.name} storage")
    tensor.quantization = _quantization(args[4])
    return tensor


def _quantization(params: Any) -> Quantization:
    if not isinstance(params, tuple) or not params or not isinstance(params[0], Global):
        raise _corrupt("quantizer parameters must be a tuple starting with a qscheme")
    scheme = params[0].name
    if scheme in ("per_tensor_affine", "per_tensor_symmetric") and len(params) == 3:
        return Quantization(scheme, scale=float(params[1]), zero_point=_int(params[2], "zero point"))
    if scheme.startswith("per_channel") and len(params) == 4:
        scales, zero_points = params[1], params[2]
        if not isinstance(scales, Tensor) or not isinstance(zero_points, Tensor):
            raise _corrupt("per-channel scales and zero points must be tensors")
        return Quantization(
            scheme, axis=_int(params[3], "quantization axis"), scales=scales, zero_points=zero_points
        )
    raise _corrupt(f"unsupported quantizer parameters for {scheme}")


def _rebuild_meta(args: tuple[Any, ...]) -> Tensor:
    if len(args) != 4:
        raise _corrupt(f"_rebuild_meta_tensor_no_storage takes 4 arguments, got {len(args)}")
    return make_tensor(None, 0, args[1], args[2], _dtype(args[0]), args[3], kind="meta")


def _rebuild_wrapper_subclass(args: tuple[Any, ...]) -> Tensor:
    if len(args) != 8:
        raise _corrupt(f"_rebuild_wrapper_subclass takes 8 arguments, got {len(args)}")
    cls, dtype, size, stride, offset, _layout, _device, requires_grad = args
    tensor = make_tensor(None, offset, size, stride, _dtype(dtype), requires_grad, kind="no_data")
    if isinstance(cls, Global):
        tensor.type_name = cls.qualname
    return tensor


def _rebuild_from_type_v2(args: tuple[Any, ...]) -> Any:
    if len(args) != 4:
        raise _corrupt(f"_rebuild_from_type_v2 takes 4 arguments, got {len(args)}")
    func, cls, inner_args, state = args
    handler = resolve(func) if isinstance(func, Global) else None
    # torch never nests these two; a nested call would recurse once per level of a hostile pickle.
    if handler is None or handler in (_rebuild_from_type_v2, _rebuild_from_type) or not isinstance(inner_args, tuple):
        return PickledObject(Global("torch._tensor", "_rebuild_from_type_v2"), args)
    result = handler(inner_args)
    if not isinstance(result, Tensor):
        return result
    if isinstance(cls, Global) and cls.qualname not in ("torch.Tensor", "torch._tensor.Tensor"):
        if cls.qualname == "torch.nn.parameter.Parameter":
            result.is_parameter = True
        else:
            result.type_name = cls.qualname
    if result.kind == "no_data" and _has_content(state):
        # A wrapper subclass (DTensor…) keeps its real tensors in its state.
        return with_whole_tensor(PickledObject(cls, (), state=state), result)
    return result


def _has_content(state: Any) -> bool:
    """Whether ``state``, or a tuple or list it nests, holds a non-empty dict or an object (each container looked
    at once): a ShardedTensor's state is a list of its local ``Shard`` objects, first."""
    pending, seen = [state], set()
    while pending:
        item = pending.pop()
        if (isinstance(item, dict) and item) or isinstance(item, PickledObject):
            return True
        if isinstance(item, (tuple, list)) and id(item) not in seen:
            seen.add(id(item))
            pending.extend(item)
    return False


def _rebuild_from_type(args: tuple[Any, ...]) -> Any:
    return _rebuild_from_type_v2(args)


def _rebuild_njt(args: tuple[Any, ...]) -> Any:
    """``torch.nested``'s jagged tensor: its keyword arguments name its component tensors."""
    if len(args) != 1 or not isinstance(args[0], dict):
        raise _corrupt("_rebuild_njt takes one dict of constructor arguments")
    return NestedTensor({k: v for k, v in args[0].items() if isinstance(v, Tensor)})


def _rebuild_sparse(args: tuple[Any, ...]) -> Any:
    if len(args) != 2 or not isinstance(args[0], str) or not isinstance(args[1], tuple):
        raise _corrupt("_rebuild_sparse_tensor takes (layout, data)")
    layout, data = args
    names = {
        "torch.sparse_coo": ("indices", "values"),
        "torch.sparse_csr": ("crow_indices", "col_indices", "values"),
        "torch.sparse_bsr": ("crow_indices", "col_indices", "values"),
        "torch.sparse_csc": ("ccol_indices", "row_indices", "values"),
        "torch.sparse_bsc": ("ccol_indices", "row_indices", "values"),
    }.get(layout)
    if names is None or len(data) < len(names) + 1:
        raise _corrupt(f"unsupported sparse layout {layout!r}")
    size = _dims(data[len(names)], "size")
    coalesced = data[3] if layout == "torch.sparse_coo" and len(data) > 3 else None
    if coalesced is not None and not isinstance(coalesced, bool):
        raise _corrupt(f"sparse is_coalesced must be a bool, got {type(coalesced).__name__}")
    components = dict(zip(names, data))
    return SparseTensor(layout.removeprefix("torch."), size, components, coalesced)


def _rebuild_nested(args: tuple[Any, ...]) -> NestedTensor:
    if len(args) != 4:
        raise _corrupt(f"_rebuild_nested_tensor takes 4 arguments, got {len(args)}")
    names = ("buffer", "sizes", "strides", "storage_offsets")
    return NestedTensor(dict(zip(names, args)))


def _rebuild_device_tensor_from_cpu(args: tuple[Any, ...]) -> Any:
    if len(args) != 4:
        raise _corrupt(f"_rebuild_device_tensor_from_cpu_tensor takes 4 arguments, got {len(args)}")
    tensor = args[0]
    if isinstance(tensor, Tensor):
        tensor.requires_grad = bool(args[3])
    return tensor


def _rebuild_device_tensor_from_numpy(args: tuple[Any, ...]) -> Tensor:
    if len(args) != 4 or not isinstance(args[0], NumpyArray):
        raise _corrupt("_rebuild_device_tensor_from_numpy takes (ndarray, dtype, device, requires_grad)")
    array, dtype = args[0], _dtype(args[1])
    if array.data is None:
        raise _corrupt("numpy array without data")
    numel = math.prod(_dims(array.shape, "size"))
    if len(array.data) != numel * dtype.itemsize:
        raise _corrupt(f"numpy data of {len(array.data)} bytes does not hold {numel} {dtype.name} elements")
    byteorder = "big" if array.dtype.startswith(">") else "little"
    storage = Storage("inline", dtype, str(args[2]), numel, "pickle", size=len(array.data),
                      byteorder=byteorder, inline_data=array.data)
    if array.fortran_order:
        stride = contiguous_strides(array.shape[::-1])[::-1]
    else:
        stride = contiguous_strides(array.shape)
    return make_tensor(storage, 0, array.shape, stride, dtype, args[3])


class LegacyTensor(Tensor, Buildable):
    """``torch.Tensor()`` or ``torch.FloatTensor()`` made empty, then given its data by ``BUILD``.

    Older torch pickled a tensor this way; torch still loads it through ``Tensor.__setstate__``: a
    state ``(storage, storage_offset, size, stride)`` views the storage, ``(data, _, hooks,
    requires_grad, _)`` is an old ``Variable`` and ``(requires_grad, _, hooks)`` sets the flag alone.
    """

    __slots__ = ("class_dtype",)

    def apply_state(self, state: Any) -> None:
        if not isinstance(state, tuple) or len(state) not in (3, 4, 5):
            raise _corrupt(f"a legacy tensor's state {short_repr(state)} is not a 3, 4 or 5-tuple")
        if len(state) == 4:
            storage = _storage(state[0])
            dtype = DTYPES["uint8"] if storage.dtype.name == "untyped" else storage.dtype
            if self.class_dtype is not None and dtype is not self.class_dtype:
                raise _corrupt(f"legacy tensor class of dtype {self.class_dtype.name} is set to a storage of "
                               f"dtype {dtype.name}")
            self._adopt(make_tensor(storage, state[1], state[2], state[3], dtype))
        elif len(state) == 5:
            if not isinstance(state[0], Tensor):
                raise _corrupt(f"a legacy Variable's data is {short_repr(state[0])}, not a tensor")
            self._adopt(state[0])
            self.requires_grad = bool(state[3])
        else:
            self.requires_grad = bool(state[0])

    def _adopt(self, other: Tensor) -> None:
        for name in Tensor.FIELDS:
            if name != "trail":
                setattr(self, name, getattr(other, name))


def _legacy_tensor_class(cls: Global, dtype: DType | None) -> Handler:
    """A tensor class called to make an empty tensor (``dtype`` None: ``torch.Tensor``, of any storage's dtype)."""

    def construct(args: tuple[Any, ...]) -> Any:
        if args:
            return PickledObject(cls, args)
        shown = dtype or DTYPES["float32"]
        empty = Storage("empty", shown, "cpu", 0, "pickle", inline_data=b"")
        tensor = LegacyTensor(shown, (0,), (1,), 0, empty)
        tensor.class_dtype = dtype
        return tensor

    return construct


def _parameter(args: tuple[Any, ...]) -> Any:
    """``Parameter(data[, requires_grad])`` called directly (NEWOBJ), as torch's loader allows."""
    if not args or len(args) > 2 or not isinstance(args[0], Tensor):
        return PickledObject(Global("torch.nn.parameter", "Parameter"), args)
    args[0].is_parameter = True
    args[0].requires_grad = bool(args[1]) if len(args) == 2 else True
    return args[0]


_LEGACY_TENSOR_CLASSES = ("Float", "Double", "Half", "BFloat16", "Byte", "Char", "Short", "Int", "Long", "Bool")

_TORCH_UTILS: dict[str, Handler] = {
    "_rebuild_tensor": _rebuild_tensor,
    "_rebuild_tensor_v2": _rebuild_tensor_v2,
    "_rebuild_tensor_v3": _rebuild_tensor_v3,
    "_rebuild_parameter": _rebuild_parameter,
    "_rebuild_parameter_with_state": _rebuild_parameter,
    "_rebuild_qtensor": _rebuild_qtensor,
    "_rebuild_sparse_tensor": _rebuild_sparse,
    "_rebuild_nested_tensor": _rebuild_nested,
    "_rebuild_meta_tensor_no_storage": _rebuild_meta,
    "_rebuild_wrapper_subclass": _rebuild_wrapper_subclass,
    "_rebuild_device_tensor_from_cpu_tensor": _rebuild_device_tensor_from_cpu,
    "_rebuild_device_tensor_from_numpy": _rebuild_device_tensor_from_numpy,
    "_rebuild_xla_tensor": _rebuild_device_tensor_from_numpy,
}

_HANDLERS: dict[tuple[str, str], Handler] = {
    **{("torch._utils", name): h for name, h in _TORCH_UTILS.items()},
    ("torch._tensor", "_rebuild_from_type_v2"): _rebuild_from_type_v2,
    ("torch._tensor", "_rebuild_from_type"): _rebuild_from_type,
    ("torch.nested._internal.nested_tensor", "_rebuild_njt"): _rebuild_njt,
    **{(m, "Tensor"): _legacy_tensor_class(Global(m, "Tensor"), None) for m in ("torch", "torch._tensor")},
    **{(m, f"{name}Tensor"): _legacy_tensor_class(Global(m, f"{name}Tensor"),
                                                  dtype_of_storage_class("torch", f"{name}Storage"))
       for name in _LEGACY_TENSOR_CLASSES for m in ("torch", "torch.cuda")},
    ("torch.nn.parameter", "Parameter"): _parameter,
    **VALUE_HANDLERS,
}


def resolve(name: Global) -> Callable[[tuple[Any, ...]], Any] | None:
    """ckptfs' own handler for a known global, or None (the call stays inert)."""
    return _HANDLERS.get((name.module, name.name))
