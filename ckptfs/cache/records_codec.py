"""Storages and tensors as columns (one int64 array per field), and back, checked as the parse checks them:
a tensor's dims and offset must fit its storage (``rebuild.make_tensor``), a storage's bytes the source."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ckptfs.cache.chunks_codec import REFERENCE_COLUMNS as CHUNK_REFERENCES
from ckptfs.cache.chunks_codec import encode_chunks
from ckptfs.cache.errors import BadEntry, NotCacheable
from ckptfs.cache.layout import DTYPE_LIST, Sections, array, dtype_code, form_starts
from ckptfs.cache.tree_encode import TreeEncoder
from ckptfs.model.dtypes import DType
from ckptfs.model.rebuild import MAX_ELEMENTS, MAX_RANK
from ckptfs.model.records import Quantization, RecordPrefix, Storage, Tensor
from ckptfs.sources import ByteSource

STORAGE_FIELDS = ("key", "dtype", "location", "numel", "record", "offset", "size", "flags", "inline", "base",
                  "base_offset")
TENSOR_FIELDS = ("dtype", "storage", "offset", "form", "flags", "kind", "type_name", "quantization")
"""A tensor's ``form`` is its (shape, stride) pair's row in the ``form_ndim`` and ``form_dims`` tables: each distinct
pair once, decoded into one pair of tuples the tensors of that form share, as the parse shares them."""
BIG_ENDIAN, COMPRESSED, WRITTEN, IN_SOURCE, RECORD_PREFIX = 1, 2, 4, 8, 16
"""Storage flags; ``RECORD_PREFIX``: ``record`` is a ``RecordPrefix``, the text before the key."""
REQUIRES_GRAD, IS_PARAMETER, CONJ, NEG = 1, 2, 4, 8
KINDS = ("dense", "meta", "no_data")
BYTEORDERS = ("little", "big")
ITEMSIZES = np.asarray([d.itemsize for d in DTYPE_LIST], dtype=np.int64)
PACKINGS = np.asarray([d.packing for d in DTYPE_LIST], dtype=np.int64)
FAST_DIM = 1 << 24
"""Below this, a form's last element is computed exactly in int64 (64 dims × 2**48 < 2**63)."""
EXACT_BELOW = 1 << 56
"""Below this, a tensor's last element offset and its bytes are computed exactly in int64 (2**57 × 16 < 2**63)."""


def encode_records(encoder: TreeEncoder) -> Sections:
    """The storage and tensor columns; their string and value references point into ``encoder``'s tables."""
    storages, tensors, ref = encoder.storage_list, encoder.tensor_list, encoder.ref
    if any(s.byteorder not in BYTEORDERS for s in storages):
        raise NotCacheable("a storage of an unknown byte order")
    if any(t.kind not in KINDS or not (t.type_name is None or type(t.type_name) is str) for t in tensors):
        raise NotCacheable("a tensor of an unknown kind")
    storage_index = encoder.storages
    forms: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
    tensor_form = [forms.setdefault((t.shape, t.stride), len(forms)) for t in tensors]
    columns: dict[str, Any] = {
        "storage_key": encoder.refs([s.key for s in storages]),
        "storage_dtype": _dtype_codes([s.dtype for s in storages]),
        "storage_location": encoder.refs([s.location for s in storages]),
        "storage_numel": [s.numel for s in storages],
        "storage_record": encoder.refs(_texts([s.stored_record for s in storages])),
        "storage_offset": [s.offset for s in storages],
        "storage_size": [s.size for s in storages],
        "storage_flags": [(s.byteorder == "big") * BIG_ENDIAN | s.compressed * COMPRESSED | s.written * WRITTEN
                          | (s.source is not None) * IN_SOURCE | (type(s.stored_record) is RecordPrefix) * RECORD_PREFIX
                          for s in storages],
        "storage_inline": [-1 if s.inline_data is None else ref(s.inline_data) for s in storages],
        "storage_base": [-1 if s.base is None else storage_index[id(s.base)] for s in storages],
        "storage_base_offset": [s.base_offset for s in storages],
        "tensor_dtype": _dtype_codes([t.dtype for t in tensors]),
        "tensor_storage": [-1 if t.storage is None else storage_index[id(t.storage)] for t in tensors],
        "tensor_offset": [t.storage_offset for t in tensors],
        "tensor_form": tensor_form,
        "tensor_flags": [t.requires_grad * REQUIRES_GRAD | t.is_parameter * IS_PARAMETER | t.conj * CONJ
                         | t.neg * NEG for t in tensors],
        "tensor_kind": [KINDS.index(t.kind) for t in tensors],
        "tensor_type_name": [-1 if t.type_name is None else ref(t.type_name) for t in tensors],
        "tensor_quantization": [-1 if t.quantization is None else ref(t.quantization) for t in tensors],
        "form_ndim": [len(shape) for shape, _ in forms],
        "form_dims": [d for form in forms for dims in form for d in dims],
    }
    out: Sections = {name: np.asarray(values, dtype=np.int64) for name, values in columns.items()}
    out.update(encode_chunks(tensors, ref))
    for name in ("storage_key", "storage_location", "storage_record", "storage_inline", "tensor_type_name",
                 "tensor_quantization", *CHUNK_REFERENCES):
        out[name] = np.where(out[name] < 0, -1, encoder.globalize(np.maximum(out[name], 0))).astype(np.int64)
    return out


def _texts(records: list[str]) -> list[str]:
    """Records as plain strings, a ``RecordPrefix`` shared by many storages made one string once."""
    ids = list(map(id, records))
    texts = {number: str(record) for number, record in dict(zip(ids, records)).items()}
    return list(map(texts.__getitem__, ids))


def _dtype_codes(dtypes: list[DType]) -> list[int]:
    """``[dtype_code(d) for d in dtypes]``, each distinct dtype looked up once (by identity: a dtype's own hash is
    Python code)."""
    ids = list(map(id, dtypes))
    codes = {number: dtype_code(dtype) for number, dtype in dict(zip(ids, dtypes)).items()}
    return list(map(codes.__getitem__, ids))


def decode_storages(sections: Sections, objs: list[Any], count: int, source: ByteSource,
                    strings: range) -> list[Storage]:
    """The storages; ``strings``: where the string table lies in ``objs``."""
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
    keys = _strings(objs, c["key"], strings, "storage key")
    locations = _strings(objs, c["location"], strings, "storage location")
    records = _records(objs, c["record"], (flags & RECORD_PREFIX) != 0, strings)
    inline_refs = c["inline"]
    inline: Any = itertools.repeat(None)
    if bool(np.any(inline_refs != -1)):
        inline = [None if i == -1 else _typed(objs, i, bytes, "inline storage data") for i in inline_refs.tolist()]
    storages = list(map(Storage, keys, _column(dtype_codes, DTYPE_LIST), locations, numel.tolist(), records,
                        offset.tolist(), size.tolist(), _column(flags & BIG_ENDIAN, BYTEORDERS),
                        _column((flags & COMPRESSED) != 0), _column((flags & WRITTEN) != 0), inline,
                        itertools.repeat(None), itertools.repeat(0), _column(in_source, (None, source))))
    for index in np.nonzero(base >= 0)[0].tolist():
        _set_base(storages, index, int(base[index]), int(base_offset[index]))
    return storages


def _records(objs: list[Any], refs: np.ndarray, prefixed: np.ndarray, strings: range) -> Iterable[str]:
    """Each storage's record: its string, or a ``RecordPrefix`` of it (one object for all that share it)."""
    values = _strings(objs, refs, strings, "storage record")
    if not bool(prefixed.any()):
        return values
    prefixes = {ref: RecordPrefix(objs[ref]) for ref in set(refs[prefixed].tolist())}
    if bool(prefixed.all()):
        return _column(refs, prefixes)
    return [prefixes[ref] if flag else value for ref, flag, value in zip(refs.tolist(), prefixed.tolist(), values)]


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
    offset, storage_index, form = c["offset"], c["storage"], c["form"]
    dtype_codes = c["dtype"]
    if int(dtype_codes.min()) < 1 or int(dtype_codes.max()) >= len(DTYPE_LIST):  # untyped is no tensor dtype
        raise BadEntry("a tensor has an unknown dtype")
    if int(offset.min()) < 0 or int(storage_index.min()) < -1 or int(storage_index.max()) >= len(storages):
        raise BadEntry("a tensor has a bad storage or offset")
    kinds = c["kind"]
    if int(kinds.min()) < 0 or int(kinds.max()) >= len(KINDS):
        raise BadEntry("a tensor has an unknown kind")
    shapes, strides, lasts = decode_forms(sections)
    if int(form.min()) < 0 or int(form.max()) >= len(shapes):
        raise BadEntry("a tensor has an unknown shape")
    storage_bytes = np.append(array(sections, "storage_numel") * ITEMSIZES[array(sections, "storage_dtype")], 0)
    room = np.where(storage_index >= 0, storage_bytes[np.maximum(storage_index, 0)], -1)
    _check_extents(form, lasts, offset, dtype_codes, room)
    forms = form.tolist()
    flags = c["flags"]
    if np.array_equal(storage_index, np.arange(count)):  # each tensor its own storage, in order: torch.save's way
        storage_list: list[Storage | None] = list(storages)
    else:
        storage_list = list(map(([*storages, None]).__getitem__, storage_index.tolist()))
    tensors = list(map(Tensor, _column(dtype_codes, DTYPE_LIST), map(shapes.__getitem__, forms),
                       map(strides.__getitem__, forms), offset.tolist(), storage_list,
                       _column((flags & REQUIRES_GRAD) != 0), _column((flags & IS_PARAMETER) != 0),
                       _column(kinds, KINDS), _column((flags & CONJ) != 0), _column((flags & NEG) != 0)))
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


def decode_forms(sections: Sections) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]], list[int]]:
    """Each form's shape and stride tuples, and the element offset of its last element (-1: it has none), held to
    ``rebuild.make_tensor``'s limits: rank, dims, at most 2**62 elements. Made a rank at a time (``zip`` of columns
    makes tuples in C)."""
    ndim = array(sections, "form_ndim")
    if len(ndim) and (int(ndim.min()) < 0 or int(ndim.max()) > MAX_RANK):
        raise BadEntry("a tensor has a bad rank")
    dims = array(sections, "form_dims", 2 * int(ndim.sum()))
    if len(dims) and int(dims.min()) < 0:
        raise BadEntry("a tensor has a negative size or stride")
    starts = form_starts(ndim)
    order = np.argsort(ndim, kind="stable")
    shapes: list[tuple[int, ...]] = []
    strides: list[tuple[int, ...]] = []
    lasts: list[int] = []
    sorted_ndim = ndim[order]
    for rank in np.flatnonzero(np.bincount(ndim)).tolist():  # np.unique would import numpy.ma
        members = order[sorted_ndim == rank]
        matrix = dims[starts[members][:, None] + np.arange(2 * rank)]
        shape, stride = matrix[:, :rank], matrix[:, rank:]
        if rank and (int(matrix.max()) >= FAST_DIM or bool(np.any(np.log2(np.maximum(shape, 1)).sum(axis=1) > 61.9))):
            lasts += [_last_element(row[:rank], row[rank:]) for row in matrix.tolist()]
        else:
            lasts += np.where(np.any(shape == 0, axis=1), -1, ((shape - 1) * stride).sum(axis=1)).tolist()
        columns = matrix.T.tolist()
        shapes += zip(*columns[:rank]) if rank else [()] * len(members)
        strides += zip(*columns[rank:]) if rank else [()] * len(members)
    back = np.empty_like(order)
    back[order] = np.arange(len(order))
    positions = back.tolist()
    return (list(map(shapes.__getitem__, positions)), list(map(strides.__getitem__, positions)),
            list(map(lasts.__getitem__, positions)))


def _last_element(shape: list[int], stride: list[int]) -> int:
    if math.prod(shape) > MAX_ELEMENTS:
        raise BadEntry("a tensor has more than 2**62 elements")
    return -1 if 0 in shape else sum((n - 1) * s for n, s in zip(shape, stride))


def _check_extents(form: np.ndarray, lasts: list[int], offset: np.ndarray, dtype_codes: np.ndarray,
                   room: np.ndarray) -> None:
    """``rebuild.make_tensor``'s check: every element of a tensor with elements inside its storage (``room`` bytes;
    -1 without a storage), ``lasts`` being each form's last element offset."""
    itemsize, packing = ITEMSIZES[dtype_codes], PACKINGS[dtype_codes]
    if max(lasts) < EXACT_BELOW and int(offset.max()) < EXACT_BELOW:
        last = np.asarray(lasts, dtype=np.int64)[form]
        needed = -(-(offset + last + 1) // packing) * itemsize
        if bool(np.any((room >= 0) & (last >= 0) & (needed > room))):
            raise BadEntry("a tensor's elements lie beyond its storage")
        return
    for index, (row, start) in enumerate(zip(form.tolist(), offset.tolist())):
        last, space = lasts[row], int(room[index])
        if space >= 0 and last >= 0 and -(-(start + last + 1) // int(packing[index])) * int(itemsize[index]) > space:
            raise BadEntry("a tensor's elements lie beyond its storage")


def _strings(objs: list[Any], refs: np.ndarray, strings: range, what: str) -> Iterable[str]:
    """The strings ``refs`` name: each must lie in the string table (``strings``: where it is in ``objs``)."""
    if len(refs) and (int(refs.min()) < strings.start or int(refs.max()) >= strings.stop):
        raise BadEntry(f"a {what} is not a string")
    return _column(refs, objs)


def _column(values: np.ndarray, table: Sequence[Any] | Mapping[int, Any] | None = None) -> Iterable[Any]:
    """A column's values (``table``: the entries they index), once each; one value repeated where all are the same,
    as flags, kinds and locations mostly are."""
    if len(values) and values.min() == values.max():
        first = values[0].item()
        return itertools.repeat(first if table is None else table[first], len(values))
    return values.tolist() if table is None else list(map(table.__getitem__, values.tolist()))


def _typed(objs: list[Any], ref: int, kind: type, what: str) -> Any:
    if not 0 <= ref < len(objs) or type(objs[ref]) is not kind:
        raise BadEntry(f"a {what} refers to a {type(objs[ref]).__name__ if 0 <= ref < len(objs) else 'nothing'}")
    return objs[ref]
