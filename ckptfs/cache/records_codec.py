"""Storages and tensors as columns (one int64 array per field), and back, checked as the parse checks them:
a tensor's dims and offset must fit its storage (``rebuild.make_tensor``), a storage's bytes the source."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ckptfs.cache.errors import BadEntry, NotCacheable
from ckptfs.cache.layout import DTYPE_LIST, Sections, array, dtype_code
from ckptfs.cache.tree_encode import TreeEncoder
from ckptfs.model.rebuild import MAX_ELEMENTS, MAX_RANK
from ckptfs.model.records import Quantization, Storage, Tensor
from ckptfs.sources import ByteSource

STORAGE_FIELDS = ("key", "dtype", "location", "numel", "record", "offset", "size", "flags", "inline", "base",
                  "base_offset")
TENSOR_FIELDS = ("dtype", "storage", "offset", "ndim", "flags", "kind", "type_name", "quantization")
BIG_ENDIAN, COMPRESSED, WRITTEN, IN_SOURCE = 1, 2, 4, 8
REQUIRES_GRAD, IS_PARAMETER, CONJ, NEG = 1, 2, 4, 8
KINDS = ("dense", "meta", "no_data")
FAST_DIM = 1 << 24
"""Below this, a tensor's extent is computed exactly in int64 (64 dims × 2**48 < 2**63)."""


def encode_records(encoder: TreeEncoder) -> Sections:
    """The storage and tensor columns; their string and value references point into ``encoder``'s tables."""
    storages = encoder.storage_list
    columns: dict[str, list[int]] = {f"storage_{f}": [] for f in STORAGE_FIELDS}
    refs = {"storage_key", "storage_location", "storage_record"}
    for s in storages:
        if s.byteorder not in ("little", "big"):
            raise NotCacheable(f"storage {s.key!r} has byte order {s.byteorder!r}")
        flags = ((s.byteorder == "big") * BIG_ENDIAN | s.compressed * COMPRESSED | s.written * WRITTEN
                 | (s.source is not None) * IN_SOURCE)
        values = (encoder.ref(s.key), dtype_code(s.dtype), encoder.ref(s.location), s.numel, encoder.ref(s.record),
                  s.offset, s.size, flags, -1 if s.inline_data is None else encoder.ref(s.inline_data),
                  -1 if s.base is None else encoder.storages[id(s.base)], s.base_offset)
        for field, value in zip(STORAGE_FIELDS, values):
            columns[f"storage_{field}"].append(value)
    tensors = encoder.tensor_list
    tcols: dict[str, list[int]] = {f"tensor_{f}": [] for f in TENSOR_FIELDS}
    dims: list[int] = []
    for t in tensors:
        if t.kind not in KINDS or not (type(t.type_name) is str or t.type_name is None):
            raise NotCacheable(f"a tensor of kind {t.kind!r}")
        flags = t.requires_grad * REQUIRES_GRAD | t.is_parameter * IS_PARAMETER | t.conj * CONJ | t.neg * NEG
        quant = -1 if t.quantization is None else encoder.ref(t.quantization)
        values = (dtype_code(t.dtype), -1 if t.storage is None else encoder.storages[id(t.storage)],
                  t.storage_offset, len(t.shape), flags, KINDS.index(t.kind),
                  -1 if t.type_name is None else encoder.ref(t.type_name), quant)
        for field, value in zip(TENSOR_FIELDS, values):
            tcols[f"tensor_{field}"].append(value)
        dims += t.shape
        dims += t.stride
    columns.update(tcols)
    out: Sections = {name: np.asarray(values, dtype=np.int64) for name, values in columns.items()}
    for name in (*refs, "storage_inline", "tensor_type_name", "tensor_quantization"):
        out[name] = np.where(out[name] < 0, -1, encoder.globalize(np.maximum(out[name], 0))).astype(np.int64)
    out["tensor_dims"] = np.asarray(dims, dtype=np.int64)
    return out


def decode_storages(sections: Sections, objs: list[Any], count: int, source: ByteSource) -> list[Storage]:
    c = {f: array(sections, f"storage_{f}", count) for f in STORAGE_FIELDS}
    if count == 0:
        return []
    flags = c["flags"]
    dtype_codes = c["dtype"]
    if int(dtype_codes.min()) < 0 or int(dtype_codes.max()) >= len(DTYPE_LIST):
        raise BadEntry("a storage has an unknown dtype")
    itemsizes = np.asarray([d.itemsize for d in DTYPE_LIST], dtype=np.int64)[dtype_codes]
    numel, size, offset = c["numel"], c["size"], c["offset"]
    if bool(np.any(numel < 0)) or bool(np.any(numel > (MAX_ELEMENTS // 16))) or bool(np.any(size < 0)):
        raise BadEntry("a storage has a negative or huge size")
    in_source = (flags & IN_SOURCE) != 0
    if bool(np.any(in_source & ((offset < 0) | (offset > source.size) | (size > source.size - offset)))):
        raise BadEntry("a storage's bytes lie beyond the end of the source")
    keys = _strings(objs, c["key"], "storage key")
    locations = _strings(objs, c["location"], "storage location")
    records = _strings(objs, c["record"], "storage record")
    inline = [None if i < 0 else _typed(objs, i, bytes, "inline storage data") for i in c["inline"].tolist()]
    dtypes = [DTYPE_LIST[i] for i in dtype_codes.tolist()]
    flag_list = flags.tolist()
    storages = list(map(Storage, keys, dtypes, locations, numel.tolist(), records, offset.tolist(), size.tolist(),
                        ["big" if f & BIG_ENDIAN else "little" for f in flag_list],
                        [bool(f & COMPRESSED) for f in flag_list], [bool(f & WRITTEN) for f in flag_list], inline))
    for storage, in_src in zip(storages, in_source.tolist()):
        if in_src:
            storage.source = source
    nbytes = numel * itemsizes
    for index, (base, base_offset) in enumerate(zip(c["base"].tolist(), c["base_offset"].tolist())):
        if base >= 0:
            if base >= index or storages[base].base is not None or base_offset < 0:
                raise BadEntry(f"storage {index} has a bad base storage")
            base_storage = storages[base]
            end = base_offset * base_storage.dtype.itemsize + int(nbytes[index])
            if end > base_storage.nbytes:
                raise BadEntry(f"storage {index} views past the end of its base")
            storages[index].base, storages[index].base_offset = base_storage, base_offset
        elif base != -1 or base_offset != 0:
            raise BadEntry(f"storage {index} has a bad base storage")
    return storages


def decode_tensors(sections: Sections, objs: list[Any], count: int, storages: list[Storage]) -> list[Tensor]:
    c = {f: array(sections, f"tensor_{f}", count) for f in TENSOR_FIELDS}
    if count == 0:
        return []
    ndim, offset, storage_index = c["ndim"], c["offset"], c["storage"]
    dtype_codes = c["dtype"]
    if int(ndim.min()) < 0 or int(ndim.max()) > MAX_RANK:
        raise BadEntry("a tensor has a bad rank")
    if int(dtype_codes.min()) < 1 or int(dtype_codes.max()) >= len(DTYPE_LIST):  # untyped is no tensor dtype
        raise BadEntry("a tensor has an unknown dtype")
    if int(offset.min()) < 0 or int(storage_index.min()) < -1 or int(storage_index.max()) >= len(storages):
        raise BadEntry("a tensor has a bad storage or offset")
    kinds = c["kind"]
    if int(kinds.min()) < 0 or int(kinds.max()) >= len(KINDS):
        raise BadEntry("a tensor has an unknown kind")
    dims = array(sections, "tensor_dims", 2 * int(ndim.sum()))
    if len(dims) and int(dims.min()) < 0:
        raise BadEntry("a tensor has a negative size or stride")
    shapes, strides = _dims(dims, ndim)
    dtypes = [DTYPE_LIST[i] for i in dtype_codes.tolist()]
    storage_list = [None if i < 0 else storages[i] for i in storage_index.tolist()]
    _check_extents(shapes, strides, dtypes, offset, storage_list, dims, ndim)
    flags = c["flags"].tolist()
    tensors = list(map(Tensor, dtypes, shapes, strides, offset.tolist(), storage_list,
                       [bool(f & REQUIRES_GRAD) for f in flags], [bool(f & IS_PARAMETER) for f in flags],
                       [KINDS[k] for k in kinds.tolist()], [bool(f & CONJ) for f in flags],
                       [bool(f & NEG) for f in flags]))
    for index, ref in enumerate(c["type_name"].tolist()):
        if ref >= 0:
            tensors[index].type_name = _typed(objs, ref, str, "tensor class name")
        elif ref != -1:
            raise BadEntry("a tensor has a bad class name")
    return tensors


def attach_quantizations(sections: Sections, objs: list[Any], tensors: list[Tensor]) -> None:
    """Sets each quantized tensor's quantization, a node decoded after the tensors."""
    refs = array(sections, "tensor_quantization", len(tensors))
    for index in np.nonzero(refs != -1)[0].tolist():
        tensors[index].quantization = _typed(objs, int(refs[index]), Quantization, "tensor quantization")


def _dims(dims: np.ndarray, ndim: np.ndarray) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """Each tensor's shape and stride tuples, made a rank at a time (``zip`` of columns makes tuples in C)."""
    starts = np.concatenate([[0], np.cumsum(2 * ndim)[:-1]]).astype(np.int64)
    order = np.argsort(ndim, kind="stable")
    shapes: list[tuple[int, ...]] = []
    strides: list[tuple[int, ...]] = []
    sorted_ndim = ndim[order]
    for rank in np.unique(ndim).tolist():
        members = order[sorted_ndim == rank]
        if rank == 0:
            shapes += [()] * len(members)
            strides += [()] * len(members)
            continue
        columns = dims[starts[members][:, None] + np.arange(2 * rank)].T.tolist()
        shapes += zip(*columns[:rank])
        strides += zip(*columns[rank:])
    back = np.empty_like(order)
    back[order] = np.arange(len(order))
    positions = back.tolist()
    return list(map(shapes.__getitem__, positions)), list(map(strides.__getitem__, positions))


def _check_extents(shapes: list[tuple[int, ...]], strides: list[tuple[int, ...]], dtypes: list[Any],
                   offset: np.ndarray, storages: list[Storage | None], dims: np.ndarray, ndim: np.ndarray) -> None:
    """``rebuild.make_tensor``'s checks: at most 2**62 elements, every element inside the storage."""
    fast = not len(dims) or int(dims.max()) < FAST_DIM
    fast = fast and int(offset.max()) < FAST_DIM * FAST_DIM
    if not fast:
        for shape, stride, dtype, off, storage in zip(shapes, strides, dtypes, offset.tolist(), storages):
            _check_extent(shape, stride, dtype, off, storage)
        return
    starts = np.concatenate([[0], np.cumsum(2 * ndim)[:-1]]).astype(np.int64)
    rank_index = np.repeat(np.arange(len(ndim)), ndim)
    within = np.arange(len(rank_index)) - np.repeat(starts // 2, ndim)
    shape_values = dims[np.repeat(starts, ndim) + within]
    stride_values = dims[np.repeat(starts + ndim, ndim) + within]
    empty = np.zeros(len(ndim), dtype=bool)
    np.logical_or.at(empty, rank_index, shape_values == 0)
    log_numel = np.zeros(len(ndim))
    np.add.at(log_numel, rank_index, np.log2(np.maximum(shape_values, 1)))
    last = offset.copy()
    np.add.at(last, rank_index, (shape_values - 1) * stride_values)
    packing = np.asarray([d.packing for d in dtypes], dtype=np.int64)
    itemsize = np.asarray([d.itemsize for d in dtypes], dtype=np.int64)
    needed = -(-(last + 1) // packing) * itemsize
    has_storage = np.asarray([s is not None for s in storages])
    nbytes = np.asarray([s.nbytes if s is not None else 0 for s in storages], dtype=np.int64)
    if bool(np.any(log_numel > 61.9)):
        for shape, stride, dtype, off, storage in zip(shapes, strides, dtypes, offset.tolist(), storages):
            _check_extent(shape, stride, dtype, off, storage)
    if bool(np.any(has_storage & ~empty & (needed > nbytes))):
        raise BadEntry("a tensor's elements lie beyond its storage")


def _check_extent(shape: tuple[int, ...], stride: tuple[int, ...], dtype: Any, offset: int,
                  storage: Storage | None) -> None:
    if math.prod(shape) > MAX_ELEMENTS:
        raise BadEntry("a tensor has more than 2**62 elements")
    if storage is not None and 0 not in shape:
        last = offset + sum((n - 1) * s for n, s in zip(shape, stride))
        if -(-(last + 1) // dtype.packing) * dtype.itemsize > storage.nbytes:
            raise BadEntry("a tensor's elements lie beyond its storage")


def _strings(objs: list[Any], refs: np.ndarray, what: str) -> list[str]:
    values = [objs[i] for i in _in_range(objs, refs, what).tolist()]
    if set(map(type, values)) - {str}:
        raise BadEntry(f"a {what} is not a string")
    return values


def _in_range(objs: list[Any], refs: np.ndarray, what: str) -> np.ndarray:
    if len(refs) and (int(refs.min()) < 0 or int(refs.max()) >= len(objs)):
        raise BadEntry(f"a {what} refers outside the tables")
    return refs


def _typed(objs: list[Any], ref: int, kind: type, what: str) -> Any:
    if not 0 <= ref < len(objs) or type(objs[ref]) is not kind:
        raise BadEntry(f"a {what} refers to a {type(objs[ref]).__name__ if 0 <= ref < len(objs) else 'nothing'}")
    return objs[ref]
