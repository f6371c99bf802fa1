"""A writer of torch ≤ 0.3's TAR checkpoints, which torch 2.13 still reads but can no longer write.

It follows torch 2.13's reader (``serialization._legacy_load.legacy_load``) byte by byte, as
``/work/shared/spec/more-formats/tar_make.py`` does: members ``sys_info``, ``pickle``, ``tensors``,
``storages`` in an uncompressed PAX tar; pickles of protocol 2 emitted opcode by opcode; each
storage an int64 element count then its little-endian bytes; each tensor record int32 ndim, 4 pad
bytes, int64 sizes, strides and offset. ``py2=True`` writes what Python 2's cPickle wrote: keys of
2**31 or more as text ``INT`` and strings as ``SHORT_BINSTRING``. Tensors come from torch (their
bytes, shapes and strides); storages shared by several tensors are written once; ``views`` adds
old torch's storage views (a storage that is a slice of another).
"""

from __future__ import annotations

import io
import struct
import tarfile
from dataclasses import dataclass, field
from typing import Any

import torch

STORAGE_CLASS = {torch.float32: "FloatStorage", torch.float64: "DoubleStorage", torch.float16: "HalfStorage",
                 torch.int64: "LongStorage", torch.int32: "IntStorage", torch.int16: "ShortStorage",
                 torch.int8: "CharStorage", torch.uint8: "ByteStorage"}
"""The storage types torch ≤ 0.3 had."""
KEY_BASE = 94_000_000_000_000
"""Keys were C pointers (``_cdata``): 14-digit numbers."""


def p_int(value: int, py2: bool) -> bytes:
    if 0 <= value < 256:
        return b"K" + bytes([value])
    if 0 <= value < 65536:
        return b"M" + struct.pack("<H", value)
    if -(2**31) <= value < 2**31:
        return b"J" + struct.pack("<i", value)
    if py2:
        return b"I" + str(value).encode() + b"\n"
    raw = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw


def p_str(text: str, py2: bool) -> bytes:
    raw = text.encode()
    if py2 and len(raw) < 256:
        return b"U" + bytes([len(raw)]) + raw
    return b"X" + struct.pack("<I", len(raw)) + raw


def p_global(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def p_tuple(*items: bytes) -> bytes:
    return b"(" + b"".join(items) + b"t"


def pickle2(body: bytes) -> bytes:
    return b"\x80\x02" + body + b"."


@dataclass
class TarCheckpoint:
    """Builds one file: add tensors (``tensor``) and values into ``body`` pickles, then ``bytes``."""

    py2: bool = False
    storages: dict[int, tuple[int, torch.Tensor]] = field(default_factory=dict)
    """By data pointer: the storage's key and a tensor over it."""
    tensors: dict[int, tuple[int, int, torch.Tensor]] = field(default_factory=dict)
    """By tensor key: its storage's key, and the tensor."""
    views: list[tuple[int, int, int, int]] = field(default_factory=list)
    keys_made: int = 0

    def _next_key(self) -> int:
        """Tensors and storages share one key space in torch's reader (``deserialized_objects``)."""
        self.keys_made += 1
        return KEY_BASE + 16 * self.keys_made

    def storage_key(self, t: torch.Tensor) -> int:
        pointer = t.untyped_storage().data_ptr()
        if pointer not in self.storages:
            self.storages[pointer] = (self._next_key(), t)
        return self.storages[pointer][0]

    def view(self, root: torch.Tensor, offset: int, numel: int) -> int:
        """A storage view: elements ``[offset, offset + numel)`` of ``root``'s storage; returns its key."""
        key = self._next_key()
        self.views.append((key, self.storage_key(root), offset, numel))
        return key

    def tensor(self, t: torch.Tensor, storage_key: int | None = None) -> bytes:
        """The persistent id that stands for ``t`` in the object pickle (over ``storage_key`` if given)."""
        storage_key = self.storage_key(t) if storage_key is None else storage_key
        key = self._next_key()
        self.tensors[key] = (storage_key, key, t)
        return p_str(str(key), self.py2) + b"Q"

    def bytes(self, body: bytes) -> bytes:
        py2 = self.py2
        sys_info = pickle2(b"}(" + p_str("protocol_version", py2) + p_int(1000, py2) + p_str("little_endian", py2)
                           + b"\x88" + p_str("type_sizes", py2) + b"}(" + p_str("short", py2) + p_int(2, py2)
                           + p_str("int", py2) + p_int(4, py2) + p_str("long", py2) + p_int(8, py2) + b"uu")
        tensors = io.BytesIO()
        tensors.write(pickle2(p_int(len(self.tensors), py2)))
        for storage_key, key, t in self.tensors.values():
            tensors.write(pickle2(p_tuple(p_int(key, py2), p_int(storage_key, py2),
                                          p_global("torch", STORAGE_CLASS[t.dtype].replace("Storage", "Tensor")))))
            tensors.write(struct.pack("<ii", t.dim(), 0))
            tensors.write(struct.pack(f"<{t.dim()}q", *t.shape))
            tensors.write(struct.pack(f"<{t.dim()}q", *t.stride()))
            tensors.write(struct.pack("<q", t.storage_offset()))
        storages = io.BytesIO()
        storages.write(pickle2(p_int(len(self.storages), py2)))
        for key, t in self.storages.values():
            storages.write(pickle2(p_tuple(p_int(key, py2), p_str("cpu", py2),
                                           p_global("torch", STORAGE_CLASS[t.dtype]))))
            data = bytes(t.untyped_storage())
            storages.write(struct.pack("<q", len(data) // t.element_size()))
            storages.write(data)
        storages.write(pickle2(b"](" + b"".join(p_tuple(*(p_int(v, py2) for v in view)) for view in self.views)
                               + b"e" if self.views else b"]"))
        members = [("sys_info", sys_info), ("pickle", pickle2(body)), ("tensors", tensors.getvalue()),
                   ("storages", storages.getvalue())]
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w:", format=tarfile.PAX_FORMAT) as tar:
            for name, data in members:
                info = tarfile.TarInfo(name)
                info.size, info.mtime, info.mode = len(data), 1_500_000_000, 0o600
                tar.addfile(info, io.BytesIO(data))
        return out.getvalue()


def ordered_dict(items: list[tuple[bytes, bytes]]) -> bytes:
    """``collections.OrderedDict`` with the given pickled keys and values, as torch ≤ 0.3's state dicts."""
    return p_global("collections", "OrderedDict") + b")R" + b"(" + b"".join(k + v for k, v in items) + b"u"


def tar_checkpoint(state: dict[str, Any], py2: bool = False) -> bytes:
    """A TAR checkpoint of a flat dict of tensors and ints (an OrderedDict, as old state dicts were)."""
    writer = TarCheckpoint(py2)
    items = []
    for name, value in state.items():
        if isinstance(value, torch.Tensor):
            items.append((p_str(name, py2), writer.tensor(value)))
        else:
            items.append((p_str(name, py2), p_int(value, py2)))
    return writer.bytes(ordered_dict(items))
