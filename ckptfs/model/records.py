"""Plain records of the checkpoint model: storages, tensors and composite tensors."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ckptfs.model.dtypes import DType
from ckptfs.sources import ByteSource

Key = Any
"""A path element: str for dict keys and attributes, int for int keys and indices."""
Trail = Any
"""A path as nested ``(key, parent_trail)`` pairs, None at the root: siblings share their parent's
trail, so a walk holds O(1) memory per node however deep the tree is. A tensor's own trail (``Tensor.trail``) is
its key alone where that is a str key at the root (``short_trail``): a state dict of 200,000 tensors holds no pair
per tensor."""


def contiguous_strides(shape: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    """The strides, in elements, of a C-order tensor of ``shape``, as torch gives them (a dimension of size 0 or
    less steps as one of size 1: ``torch.empty(2, 0, 3).stride() == (3, 3, 1)``)."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size if type(size) is int and size > 1 else 1
    return tuple(reversed(strides))


def short_trail(trail: Trail) -> Trail:
    """``trail`` as a tensor keeps it: its key alone where that is a str key at the root."""
    return trail[0] if trail is not None and trail[1] is None and type(trail[0]) is str else trail


def path_of(trail: Trail) -> tuple[Key, ...]:
    """The keys from the root to the end of ``trail`` (a short one too)."""
    keys = []
    while trail is not None:
        if type(trail) is str:
            keys.append(trail)
            break
        key, trail = trail
        keys.append(key)
    return tuple(reversed(keys))


class RecordPrefix(str):
    """A storage's record given as the text before its key (``Storage.record`` is then the two joined when asked
    for): a torch.save archive's ``data/<key>``, one shared text instead of a string per storage."""

    __slots__ = ()


class _Record:
    """A record most of whose fields most instances leave at their defaults: those are class attributes, set in the
    instance's ``__dict__`` only where they differ (a slot costs 8 bytes in each of 200,000 records, a class
    default nothing). ``FIELDS``: every field, in the constructor's order."""

    __slots__ = ()
    FIELDS: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{name}={getattr(self, name)!r}' for name in self.FIELDS)})"

    def _keep(self, fields: tuple[tuple[str, Any], ...]) -> None:
        """Sets each field of ``fields`` whose value differs from the class's default."""
        for name, value in fields:
            if value != getattr(type(self), name):
                setattr(self, name, value)


_R = TypeVar("_R", bound=_Record)


def replace(record: _R, **changes: Any) -> _R:
    """A copy of ``record`` with ``changes`` made to its fields (``dataclasses.replace`` for records)."""
    made = copy.copy(record)
    for name, value in changes.items():
        setattr(made, name, value)
    return made


class Storage(_Record):
    """One stored buffer that tensors view. Tensors sharing it share this object."""

    __slots__ = ("key", "dtype", "location", "numel", "_record", "offset", "size", "source", "__dict__")
    FIELDS = ("key", "dtype", "location", "numel", "record", "offset", "size", "byteorder", "compressed", "written",
              "inline_data", "base", "base_offset", "source")

    key: str
    dtype: DType
    """Element type the storage was declared with (``untyped`` = bytes)."""
    location: str
    numel: int
    """Declared element count (bytes for untyped storages)."""
    _record: str
    """``record``, or a ``RecordPrefix`` to put before ``key``."""
    offset: int
    """Absolute byte offset of the data in the source; -1 while unresolved."""
    size: int
    """Bytes actually available on disk for this storage."""
    source: ByteSource | None
    """The source holding the bytes at ``offset``; None for bytes held in the pickle."""
    byteorder: str = "little"
    compressed: bool = False
    """The record is deflated: ``offset`` points at compressed bytes."""
    written: bool = True
    """False for a record ``torch.serialization.skip_data`` reserved without writing its bytes."""
    inline_data: bytes | None = None
    """Bytes held in the pickle itself (numpy-backed device tensors)."""
    base: Storage | None = None
    """For old legacy view storages: the root storage whose bytes this views."""
    base_offset: int = 0
    """Element offset into ``base`` (elements of the base's dtype)."""

    def __init__(self, key: str, dtype: DType, location: str, numel: int, record: str = "", offset: int = -1,
                 size: int = 0, byteorder: str = "little", compressed: bool = False, written: bool = True,
                 inline_data: bytes | None = None, base: Storage | None = None, base_offset: int = 0,
                 source: ByteSource | None = None) -> None:
        self.key, self.dtype, self.location, self.numel = key, dtype, location, numel
        self._record, self.offset, self.size, self.source = record, offset, size, source
        if (byteorder != "little" or compressed or not written or inline_data is not None or base is not None
                or base_offset):
            self._keep((("byteorder", byteorder), ("compressed", compressed), ("written", written),
                        ("inline_data", inline_data), ("base", base), ("base_offset", base_offset)))

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    @property
    def record(self) -> str:
        """Where the bytes are: a zip record name, or ``legacy:<key>``."""
        record = self._record
        return str.__add__(record, self.key) if type(record) is RecordPrefix else record

    @record.setter
    def record(self, record: str) -> None:
        self._record = record

    @property
    def stored_record(self) -> str:
        """``record`` as this storage holds it: the whole text, or a ``RecordPrefix`` to put before ``key``."""
        return self._record


@dataclass(slots=True)
class Quantization:
    scheme: str
    """``per_tensor_affine``, ``per_channel_affine`` …"""
    scale: float | None = None
    zero_point: int | None = None
    axis: int | None = None
    scales: Tensor | None = None
    zero_points: Tensor | None = None


class Tensor(_Record):
    """A tensor record: metadata and where its bytes live. Holds no data."""

    __slots__ = ("dtype", "shape", "stride", "storage_offset", "storage", "kind", "trail", "__dict__")
    FIELDS = ("dtype", "shape", "stride", "storage_offset", "storage", "requires_grad", "is_parameter", "kind", "conj",
              "neg", "quantization", "type_name", "trail", "chunks")

    dtype: DType
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int
    storage: Storage | None
    kind: str
    """``dense`` (has bytes), ``meta`` (meta device) or ``no_data`` (wrapper subclass, skipped)."""
    trail: Trail
    """Where this tensor was first met (see ``path``), short where it can be (see ``Trail``)."""
    requires_grad: bool = False
    is_parameter: bool = False
    conj: bool = False
    neg: bool = False
    quantization: Quantization | None = None
    type_name: str | None = None
    """The Python class when not a plain Tensor/Parameter (e.g. a tensor subclass)."""
    chunks: list[Chunk] | None = None
    """For a tensor stored in pieces (a torch.distributed.checkpoint item): the pieces; ``storage`` is None."""

    def __init__(self, dtype: DType, shape: tuple[int, ...], stride: tuple[int, ...], storage_offset: int,
                 storage: Storage | None, requires_grad: bool = False, is_parameter: bool = False, kind: str = "dense",
                 conj: bool = False, neg: bool = False, quantization: Quantization | None = None,
                 type_name: str | None = None, trail: Trail = None, chunks: list[Chunk] | None = None) -> None:
        self.dtype, self.shape, self.stride, self.storage_offset = dtype, shape, stride, storage_offset
        self.storage, self.kind, self.trail = storage, kind, trail
        if requires_grad or is_parameter or conj or neg or quantization is not None or type_name is not None:
            self._keep((("requires_grad", requires_grad), ("is_parameter", is_parameter), ("conj", conj), ("neg", neg),
                        ("quantization", quantization), ("type_name", type_name)))
        if chunks is not None:  # every tensor of a DCP checkpoint: set without _keep's comparisons
            self.chunks = chunks

    @property
    def path(self) -> tuple[Key, ...]:
        """Keys from the root object to the first place this tensor was met."""
        return path_of(self.trail)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        """Size of the tensor's logical bytes (packed types: stored bytes)."""
        if self.kind != "dense":
            return 0
        return -(-self.numel // self.dtype.packing) * self.dtype.itemsize

    @property
    def has_data(self) -> bool:
        return self.kind == "dense" and (self.storage is not None or self.chunks is not None)

    @property
    def byteorder(self) -> str:
        return self.storage.byteorder if self.storage is not None else "little"

    @property
    def numpy_dtype(self) -> str | None:
        return self.dtype.numpy

    @property
    def is_contiguous(self) -> bool:
        expected = 1
        for size, stride in zip(reversed(self.shape), reversed(self.stride)):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True

    @property
    def device(self) -> str:
        if self.chunks is not None:
            return "cpu"
        return self.storage.location if self.storage is not None else "meta"


@dataclass(eq=False, slots=True)
class Chunk:
    """A box of a chunked tensor, stored as a tensor of its own in a complete torch.save archive (a blob)
    at ``[start, start+length)`` of the file ``file``.

    The box is ``offsets``/``sizes`` in the whole tensor; its elements are in C
    order within the box. ``tensor`` is the blob's tensor record once the blob
    is parsed (on first read), with its own size, stride and storage offset.
    A ShardedTensor's shard (``model.sharded``) has no ``file``: ``tensor`` is the
    shard's tensor record, in the same checkpoint.
    """

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    file: str
    start: int
    length: int
    transforms: tuple[str, ...] = ()
    """Encodings of the blob, outermost last (``stream.zstd/1``)."""
    tensor: Tensor | None = None

    @property
    def numel(self) -> int:
        return math.prod(self.sizes)


@dataclass(eq=False, slots=True)
class SparseTensor:
    """A sparse tensor: metadata plus its component tensors (indices, values, …)."""

    layout: str
    size: tuple[int, ...]
    components: dict[str, Any]
    is_coalesced: bool | None = None


@dataclass(eq=False, slots=True)
class NestedTensor:
    """A strided nested tensor: a flat buffer and per-component sizes, strides, offsets."""

    components: dict[str, Any] = field(default_factory=dict)
