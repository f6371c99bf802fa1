"""Storages and tensors as columns (one int64 array per field), and back, checked as the parse checks them:
a tensor's dims and offset must fit its storage (``rebuild.make_tensor``), a storage's bytes the source."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from ckptfs.cache.chunks_codec import REFERENCE_COLUMNS as CHUNK_REFERENCES
from ckptfs.cache.chunks_codec import encode_chunks
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
BYTEORDERS = ("little", "big")
ITEMSIZES = np.asarray([d.itemsize for d in DTYPE_LIST], dtype=np.int64)
PACKINGS = np.asarray([d.packing for d in DTYPE_LIST], dtype=np.int64)
FAST_DIM = 1 << 24
"""Below this, a tensor's extent is computed exactly in int64 (64 dims × 2**48 < 2**63)."""


def encode_records(encoder: TreeEncoder) -> Sections:
    """The storage and tensor columns; their string and value references point into ``encoder``'s tables."""
    storages, tensors, ref = encoder.storage_list, encoder.tensor_list, encoder.ref
    if any(s.byteorder not in BYTEORDERS for s in storages):
        raise NotCacheable("a storage of an unknown byte order")
    if any(t.kind not in KINDS or not (t.type_name is None or type(t.type_name) is str) for t in tensors):
        raise NotCacheable("a tensor of an unknown kind")
    storage_index = encoder.storages
    columns: dict[str, Any] = {
        "storage_key": [ref(s.key) for s in storages],
        "storage_dtype": [dtype_code(s.dtype) for s in storages],
        "storage_location": [ref(s.location) for s in storages],
        "storage_numel": [s.numel for s in storages],
        "storage_record": [ref(s.record) for s in storages],
        "storage_offset": [s.offset for s in storages],
        "storage_size": [s.size for s in storages],
        "storage_flags": [(s.byteorder == "big") * BIG_ENDIAN | s.compressed * COMPRESSED | s.written * WRITTEN
                          | (s.source is not None) * IN_SOURCE for s in storages],
        "storage_inline": [-1 if s.inline_data is None else ref(s.inline_data) for s in storages],
        "storage_base": [-1 if s.base is None else storage_index[id(s.base)] for s in storages],
        "storage_base_offset": [s.base_offset for s in storages],
        "tensor_dtype": [dtype_code(t.dtype) for t in tensors],
        "tensor_storage": [-1 if t.storage is None else storage_index[id(t.storage)] for t in tensors],
        "tensor_offset": [t.storage_offset for t in tensors],
        "tensor_ndim": [len(t.shape) for t in tensors],
        "tensor_flags": [t.requires_grad * REQUIRES_GRAD | t.is_parameter * IS_PARAMETER | t.conj * CONJ
                         | t.neg * NEG for t in tensors],
        "tensor_kind": [KINDS.index(t.kind) for t in tensors],
        "tensor_type_name": [-1 if t.type_name is None else ref(t.type_name) for t in tensors],
        "tensor_quantization": [-1 if t.quantization is None else ref(t.quantization) for t in tensors],
        "tensor_dims": [d for t in tensors for dims in (t.shape, t.stride) for d in dims],
    }
    out: Sections = {name: np.asarray(values, dtype=np.int64) for name, values in columns.items()}
    out.update(encode_chunks(tensors, ref))
    for name in ("storage_key", "storage_location", "storage_record", "storage_inline", "tensor_type_name",
                 "tensor_quantization", *CHUNK_REFERENCES):
        out[name] = np.where(out[name] < 0, -1, encoder.globalize(np.maximum(out[name], 0))).astype(np.int64)
    return out


def decode_storages(sections: Sections, objs: list[Any], count: int, source: ByteSource) -> list[Storage]:
    c = {f: array(sections, f"storage_{f}", count) for f in STORAGE_FIELDS}
    if count == 0:
        return []
    flags = c["flags"]
    dtype_codes = c["dtype"]
    if int(dtype_codes.min()) < 0 or int(dtype_codes.max()) >= len(DTYPE_LIST):
        raise BadEntry("a storage has an unknown dtype")
    numel, size, offset = c["numel"], c["size"], c["offset"]
    if bool(np.any(numel < 0)) or bool(np.any(numel > (MAX_ELEMENTS // 16))) or bool(np.any(size < 0)):
        raise BadEntry("a storage has a negative or huge size")
    in_source = (flags & IN_SOURCE) != 0
    if bool(np.any(in_source & ((offset < 0) | (offset > source.size) | (size > source.size - offset)))):
        raise BadEntry("a storage's bytes lie beyond the end of the source")
    base, base_offset = c["base"], c["base_offset"]
    if bool(np.any((base < 0) & ((base != -1) | (base_offset != 0)))):
        raise BadEntry("a storage has a bad base storage")
    keys = _strings(objs, c["key"], "storage key")
    locations = _strings(objs, c["location"], "storage location")
    records = _strings(objs, c["record"], "storage record")
    inline_refs = c["inline"]
    inline: Any = itertools.repeat(None)
    if bool(np.any(inline_refs != -1)):
        inline = [None if i == -1 else _typed(objs, i, bytes, "inline storage data") for i in inline_refs.tolist()]
    dtypes = list(map(DTYPE_LIST.__getitem__, dtype_codes.tolist()))
    storages = list(map(Storage, keys, dtypes, locations, numel.tolist(), records, offset.tolist(), size.tolist(),
                        map(BYTEORDERS.__getitem__, (flags & BIG_ENDIAN).tolist()),
                        ((flags & COMPRESSED) != 0).tolist(), ((flags & WRITTEN) != 0).tolist(), inline,
                        itertools.repeat(None), itertools.repeat(0),
                        map((None, source).__getitem__, in_source.tolist())))
    for index in np.nonzero(base >= 0)[0].tolist():
        _set_base(storages, index, int(base[index]), int(base_offset[index]))
    return storages


def _set_base(storages: list[Storage], index: int, base: int, base_offset: int) -> None:
    if base >= index or storages[base].base is not None or base_offset < 0:
        raise BadEntry(f"storage {index} has a bad base storage")
    base_storage = storages[base]
    if base_offset * base_storage.dtype.itemsize + storages[index].nbytes > base_storage.nbytes:
        raise BadEntry(f"storage {index} views past the end of its base")
    storages[index].base, storages[index].base_offset = base_storage, base_offset


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
    storage_bytes = np.append(array(sections, "storage_numel") * ITEMSIZES[array(sections, "storage_dtype")], 0)
    room = np.where(storage_index >= 0, storage_bytes[np.maximum(storage_index, 0)], -1)
    shapes, strides = _checked_dims(dims, ndim, offset, dtype_codes, room)
    storage_list = list(map(([*storages, None]).__getitem__, storage_index.tolist()))
    flags = c["flags"]
    tensors = list(map(Tensor, map(DTYPE_LIST.__getitem__, dtype_codes.tolist()), shapes, strides, offset.tolist(),
                       storage_list, ((flags & REQUIRES_GRAD) != 0).tolist(), ((flags & IS_PARAMETER) != 0).tolist(),
                       map(KINDS.__getitem__, kinds.tolist()), ((flags & CONJ) != 0).tolist(),
                       ((flags & NEG) != 0).tolist()))
    type_refs = c["type_name"]
    if bool(np.any(type_refs < -1)):
        raise BadEntry("a tensor has a bad class name")
    for index in np.nonzero(type_refs >= 0)[0].tolist():
        tensors[index].type_name = _typed(objs, int(type_refs[index]), str, "tensor class name")
    return tensors


def attach_quantizations(sections: Sections, objs: list[Any], tensors: list[Tensor]) -> None:
    """Sets each quantized tensor's quantization, a node decoded after the tensors."""
    refs = array(sections, "tensor_quantization", len(tensors))
    for index in np.nonzero(refs != -1)[0].tolist():
        tensors[index].quantization = _typed(objs, int(refs[index]), Quantization, "tensor quantization")


def _checked_dims(dims: np.ndarray, ndim: np.ndarray, offset: np.ndarray, dtype_codes: np.ndarray,
                  room: np.ndarray) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """Each tensor's shape and stride tuples, made a rank at a time (``zip`` of columns makes tuples in C), with
    ``rebuild.make_tensor``'s checks: at most 2**62 elements, every element inside the storage (``room`` bytes;
    -1 without a storage)."""
    starts = np.concatenate([[0], np.cumsum(2 * ndim)[:-1]]).astype(np.int64)
    order = np.argsort(ndim, kind="stable")
    shapes: list[tuple[int, ...]] = []
    strides: list[tuple[int, ...]] = []
    sorted_ndim = ndim[order]
    itemsize, packing = ITEMSIZES[dtype_codes], PACKINGS[dtype_codes]
    for rank in np.flatnonzero(np.bincount(ndim)).tolist():  # np.unique would import numpy.ma
        members = order[sorted_ndim == rank]
        matrix = dims[starts[members][:, None] + np.arange(2 * rank)]
        shape, stride = matrix[:, :rank], matrix[:, rank:]
        if rank and (int(matrix.max()) >= FAST_DIM or int(offset[members].max()) >= FAST_DIM * FAST_DIM
                     or bool(np.any(np.log2(np.maximum(shape, 1)).sum(axis=1) > 61.9))):
            for row, member in zip(matrix.tolist(), members.tolist()):
                _check_extent(row[:rank], row[rank:], int(offset[member]), int(itemsize[member]),
                              int(packing[member]), int(room[member]))
        else:
            last = offset[members] + ((shape - 1) * stride).sum(axis=1)
            needed = -(-(last + 1) // packing[members]) * itemsize[members]
            used = (room[members] >= 0) & ~np.any(shape == 0, axis=1)
            if bool(np.any(used & (needed > room[members]))):
                raise BadEntry("a tensor's elements lie beyond its storage")
        columns = matrix.T.tolist()
        shapes += zip(*columns[:rank]) if rank else [()] * len(members)
        strides += zip(*columns[rank:]) if rank else [()] * len(members)
    back = np.empty_like(order)
    back[order] = np.arange(len(order))
    positions = back.tolist()
    return list(map(shapes.__getitem__, positions)), list(map(strides.__getitem__, positions))


def _check_extent(shape: list[int], stride: list[int], offset: int, itemsize: int, packing: int, room: int) -> None:
    if math.prod(shape) > MAX_ELEMENTS:
        raise BadEntry("a tensor has more than 2**62 elements")
    if room >= 0 and 0 not in shape:
        last = offset + sum((n - 1) * s for n, s in zip(shape, stride))
        if -(-(last + 1) // packing) * itemsize > room:
            raise BadEntry("a tensor's elements lie beyond its storage")


def _strings(objs: list[Any], refs: np.ndarray, what: str) -> list[str]:
    values = list(map(objs.__getitem__, _in_range(objs, refs, what).tolist()))
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
