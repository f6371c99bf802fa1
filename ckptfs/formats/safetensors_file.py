"""safetensors files as input: an 8-byte little-endian header length, a JSON header naming each tensor's dtype,
shape and ``data_offsets`` (relative to the data after the header), then the data. No pickle at all.

The tree is flat: ``{name: tensor}`` in header order, names as they are (``model.embed.weight``, never split on
dots), so ``ckptfs diff model.pt model.safetensors`` matches tensors by their dotted keys. Every tensor is its own
stored range, served zero-copy. ``__metadata__`` (strings) goes to ``details``.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from ckptfs.errors import CorruptCheckpointError, LimitExceededError
from ckptfs.formats.interface import ParsedCheckpoint
from ckptfs.formats.prefetch import Prefetch
from ckptfs.limits import Limits
from ckptfs.model import rebuild
from ckptfs.model.dtypes import dtype_by_name
from ckptfs.model.records import Storage, contiguous_strides
from ckptfs.pickle.values import short_repr

DTYPE_NAMES = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "complex64": "C64",
    "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8",
    "uint64": "U64", "uint32": "U32", "uint16": "U16", "uint8": "U8", "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "float8_e4m3fnuz": "F8_E4M3FNUZ",
    "float8_e5m2fnuz": "F8_E5M2FNUZ", "float8_e8m0fnu": "F8_E8M0", "float4_e2m1fn_x2": "F4",
}
"""safetensors 0.8's dtype names, by torch dtype."""
TORCH_DTYPES = {name: torch_name for torch_name, name in DTYPE_NAMES.items()}
PACKED_F4 = "float4_e2m1fn_x2"
"""Two 4-bit values a byte: safetensors counts values, so its last axis is torch's doubled."""
METADATA_KEY = "__metadata__"
HEADER_LENGTH = struct.Struct("<Q")


def probe(opening: Prefetch, head: bytes, limits: Limits) -> bool:
    """A header length that fits in the file, followed by the JSON object that starts the header."""
    if len(head) < HEADER_LENGTH.size + 2 or head[8:9] != b"{":
        return False
    (length,) = HEADER_LENGTH.unpack_from(head)
    return 2 <= length <= opening.size - HEADER_LENGTH.size


def open_safetensors(opening: Prefetch, limits: Limits) -> ParsedCheckpoint:
    (length,) = HEADER_LENGTH.unpack(opening.read(0, HEADER_LENGTH.size))
    if length > limits.max_pickle_bytes:
        raise LimitExceededError(f"safetensors header of {length} bytes exceeds {limits.max_pickle_bytes} "
                                 "(limit max_pickle_bytes)")
    try:
        header = json.loads(opening.read(HEADER_LENGTH.size, length))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CorruptCheckpointError(f"safetensors header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise CorruptCheckpointError(f"safetensors header is {short_repr(header)}, not an object")
    if len(header) > limits.max_tensors + 1:
        raise LimitExceededError(f"safetensors header names {len(header)} tensors (limit max_tensors="
                                 f"{limits.max_tensors})")
    data_start = HEADER_LENGTH.size + length
    data_size = opening.size - data_start
    source = opening.source
    root: dict[str, Any] = {}
    storages = []
    for name, spec in header.items():
        if name == METADATA_KEY:
            continue
        storage, tensor = _tensor(name, spec, data_start, data_size, source)
        storages.append(storage)
        root[name] = tensor
    metadata = header.get(METADATA_KEY)
    details = {"header_bytes": length, "metadata": metadata if isinstance(metadata, dict) else None}
    return ParsedCheckpoint("safetensors", root, storages, "little", details)


def _tensor(name: str, spec: Any, data_start: int, data_size: int, source: Any) -> tuple[Storage, Any]:
    where = f"safetensors tensor {short_repr(name)}"
    if not (isinstance(spec, dict) and isinstance(spec.get("dtype"), str) and isinstance(spec.get("shape"), list)
            and isinstance(spec.get("data_offsets"), list) and len(spec["data_offsets"]) == 2):
        raise CorruptCheckpointError(f"{where} is {short_repr(spec)}, not {{dtype, shape, data_offsets}}")
    dtype = dtype_by_name(TORCH_DTYPES.get(spec["dtype"], ""))
    if dtype is None:
        raise CorruptCheckpointError(f"{where} has an unknown dtype {short_repr(spec['dtype'])}")
    begin, end = spec["data_offsets"]
    if not (type(begin) is int and type(end) is int and 0 <= begin <= end <= data_size):
        raise CorruptCheckpointError(f"{where} has data_offsets {short_repr(spec['data_offsets'])} outside the "
                                     f"{data_size} data bytes")
    shape = list(spec["shape"])
    if dtype.name == PACKED_F4 and shape:
        if type(shape[-1]) is not int or shape[-1] % 2:
            raise CorruptCheckpointError(f"{where} of F4 has an odd last axis {short_repr(shape[-1])}")
        shape[-1] //= 2
    storage = Storage(name, dtype, "cpu", (end - begin) // dtype.itemsize, name, size=end - begin,
                      source=source)
    storage.offset = data_start + begin
    tensor = rebuild.make_tensor(storage, 0, tuple(shape), contiguous_strides(shape), dtype)
    if tensor.nbytes != end - begin:
        raise CorruptCheckpointError(f"{where} of shape {short_repr(spec['shape'])} ({spec['dtype']}) needs "
                                     f"{tensor.nbytes} bytes, its data_offsets give {end - begin}")
    return storage, tensor
