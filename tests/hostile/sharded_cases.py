"""Hostile ``torch.distributed._shard`` ShardedTensors in a torch.save archive, made byte by byte (no torch): the
pickle torch writes (``_rebuild_from_type_v2`` of ``_rebuild_wrapper_subclass``, the state ``(local shards,
ShardedTensorMetadata, …)``, each ``Shard`` a tensor and a ``ShardMetadata`` box) with lying boxes, sizes, dtypes
and counts. Shards that make the whole tensor give ``__gathered__``; anything else keeps the shards as they are and
says why in ``__not_gathered__``, and never fails the open.

The valid layout: ``st``, float32 4×2, rows 0–1 in storage ``0`` and rows 2–3 in storage ``1``.
"""

from __future__ import annotations

import re
import struct
from typing import Any, Callable

import ckptfs
from ckptfs.errors import CorruptCheckpointError
from hostile.cases import case
from hostile.containers import zip_checkpoint
from hostile.picklegen import (
    BUILD,
    EMPTY_TUPLE,
    NEWOBJ,
    call,
    dct,
    get,
    glob,
    i,
    ints,
    lst,
    pickle,
    put,
    s,
    storage_pid,
    tensor_v2,
    tup,
)

SHARDED = "torch.distributed._shard.sharded_tensor"
ROWS = struct.pack("<8f", *range(8))
"""``st``'s bytes."""
Box = tuple[tuple[int, ...], tuple[int, ...]]


def _obj(module: str, name: str, state: bytes) -> bytes:
    return glob(module, name) + EMPTY_TUPLE + NEWOBJ + state + BUILD


def _slots(**fields: bytes) -> bytes:
    """A ``(None, slots)`` state, as a class with ``__slots__`` pickles."""
    return tup(b"N", dct(*((s(k), v) for k, v in fields.items())))


def _stride(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _shard(key: str, box: Box, shape: tuple[int, ...] | None = None, storage: str = "FloatStorage",
           offsets: bytes | None = None) -> bytes:
    shape = box[1] if shape is None else shape
    numel = 1
    for size in shape:
        numel *= size
    tensor = tensor_v2(storage_pid(storage, key, numel), i(0), ints(*shape), ints(*_stride(shape)))
    metadata = _obj("torch.distributed._shard.metadata", "ShardMetadata", _slots(
        shard_offsets=offsets if offsets is not None else lst(*map(i, box[0])), shard_sizes=lst(*map(i, box[1])),
        placement=b"N"))
    return _obj(f"{SHARDED}.shard", "Shard", _slots(tensor=tensor, metadata=metadata))


def sharded_tensor(size: tuple[int, ...], shards: bytes, meta_size: tuple[int, ...] | None = None,
                   dtype: str = "float32") -> bytes:
    """``{'st': ShardedTensor}`` whose wrapper has ``size`` and whose state lists ``shards`` (a pickled list)."""
    cls = glob(f"{SHARDED}.api", "ShardedTensor")
    metadata = _obj(f"{SHARDED}.metadata", "ShardedTensorMetadata", dct(
        (s("shards_metadata"), lst()), (s("size"), call(glob("torch", "Size"), ints(*(meta_size or size)))),
        (s("tensor_properties"), b"N")))
    wrapper = call(glob("torch._tensor", "_rebuild_from_type_v2"), glob("torch._utils", "_rebuild_wrapper_subclass"),
                   cls, tup(cls, glob("torch", dtype), ints(*size), ints(*_stride(size)), i(0), b"N", b"N", b"\x89"),
                   tup(shards, metadata, b"N", b"N", b"\x89"))
    return pickle(dct((s("st"), wrapper)))


def _archive(size: tuple[int, ...], boxes: list[Box], meta_size: tuple[int, ...] | None = None,
             dtype: str = "float32") -> Callable[[Any], bytes]:
    """Shard ``n`` holds box ``n``, in storage ``n``: the next floats counting from 0 (shard 0 holds 0, 1, …)."""
    def build(env: Any) -> bytes:
        records, shards, first = {}, [], 0
        for n, box in enumerate(boxes):
            numel = 1
            for extent in box[1]:
                numel *= extent
            records[str(n)] = struct.pack(f"<{numel}f", *range(first, first + numel))
            first += numel
            shards.append(_shard(str(n), box))
        return zip_checkpoint(sharded_tensor(size, lst(*shards), meta_size, dtype), records)

    return build


def _gathered(expected: bytes) -> Callable[[ckptfs.Checkpoint], None]:
    def check(ck: ckptfs.Checkpoint) -> None:
        assert ck.read(ck.tensor(("st", "__gathered__"))) == expected

    return check


def _not_gathered(reason: str) -> Callable[[ckptfs.Checkpoint], None]:
    """No whole tensor, the reason given; every shard still reads."""

    def check(ck: ckptfs.Checkpoint) -> None:
        items = ck.root["st"].dict_items
        assert [key for key, _ in items] == ["__not_gathered__"], items
        assert re.fullmatch("the local shards do not make the whole tensor: " + reason, items[0][1]), items[0][1]
        for tensor in ck.tensors:
            ck.read(tensor, 0, 1 << 16)

    return check


def _repeated_empty_shard(count: int) -> Callable[[Any], bytes]:
    """The two real row shards, then one empty shard (0×2 at row 4) referenced ``count`` times: the boxes cover
    the tensor, but past ``OVERLAP_CHECKED_SHARDS`` every window of a read visits each of them."""
    def build(env: Any) -> bytes:
        empty = _shard("2", ((4, 0), (0, 2))) + put(0)
        shards = lst(_shard("0", ((0, 0), (2, 2))), _shard("1", ((2, 0), (2, 2))), empty, *[get(0)] * (count - 1))
        return zip_checkpoint(sharded_tensor((4, 2), shards), {"0": ROWS[:16], "1": ROWS[16:], "2": b""})

    return build


def _many_overlapping(env: Any) -> bytes:
    """300 one-row shards of a 300×1 tensor, row 5 given twice and row 6 never: the count matches, and past
    ``OVERLAP_CHECKED_SHARDS`` the overlap is found when the rows are read."""
    rows = [n if n != 6 else 5 for n in range(300)]
    shards = lst(*(_shard(str(n), ((row, 0), (1, 1))) for n, row in enumerate(rows)))
    return zip_checkpoint(sharded_tensor((300, 1), shards), {str(n): ROWS[:4] for n in range(300)})


def _reads_fail(reason: str) -> Callable[[ckptfs.Checkpoint], None]:
    def check(ck: ckptfs.Checkpoint) -> None:
        try:
            ck.read(ck.tensor(("st", "__gathered__")))
        except CorruptCheckpointError as exc:
            assert re.search(reason, exc.reason), exc.reason
        else:
            raise AssertionError("the overlapping shards read")

    return check


ROW_SHARDS: list[Box] = [((0, 0), (2, 2)), ((2, 0), (2, 2))]
case("sharded_valid", "sharded", _archive((4, 2), ROW_SHARDS), check=_gathered(ROWS))
case("sharded_columns", "sharded", _archive((2, 4), [((0, 0), (2, 2)), ((0, 2), (2, 2))]),
     check=_gathered(struct.pack("<8f", 0, 1, 4, 5, 2, 3, 6, 7)))
case("sharded_overlap", "sharded", _archive((4, 2), [((0, 0), (3, 2)), ((2, 0), (1, 2))]),
     check=_not_gathered(r"the shards at \[0, 0\] and \[2, 0\] overlap"))
case("sharded_hole", "sharded", _archive((4, 2), ROW_SHARDS[:1]),
     check=_not_gathered(r"they hold 4 of its 8 elements \(the rest were on other ranks\)"))
case("sharded_out_of_bounds", "sharded", _archive((4, 2), [((0, 0), (2, 2)), ((3, 0), (2, 2))]),
     check=_not_gathered(r"local shard 1 at \[3, 0\] of size \[2, 2\] lies outside \[4, 2\]"))
case("sharded_offset_beyond_int64", "sharded",
     lambda env: zip_checkpoint(sharded_tensor((4, 2), lst(_shard("0", ROW_SHARDS[0]), _shard(
         "1", ROW_SHARDS[1], offsets=lst(i(1 << 70), i(0))))), {"0": ROWS[:16], "1": ROWS[16:]}),
     check=_not_gathered(r"local shard 1's offsets a list and sizes \[2, 2\] are not 2 non-negative integers each"))
case("sharded_metadata_size_differs", "sharded", _archive((4, 2), ROW_SHARDS, meta_size=(8, 2)),
     check=_not_gathered(r"the metadata's size \[8, 2\] is not the tensor's \[4, 2\]"))
case("sharded_shard_of_another_dtype", "sharded", _archive((4, 2), ROW_SHARDS, dtype="int32"),
     check=_not_gathered(r"local shard 0 is a float32 tensor of size \[2, 2\], not int32 of size \[2, 2\]"))
case("sharded_shard_not_a_shard", "sharded",
     lambda env: zip_checkpoint(sharded_tensor((4, 2), lst(i(3))), {}),
     check=_not_gathered(r"local shard 0 is not a Shard"))
case("sharded_many_empty_shards", "sharded", _repeated_empty_shard(20_000), check=_gathered(ROWS))
case("sharded_many_overlapping", "sharded", _many_overlapping,
     check=_reads_fail(r"chunks of tensor \('st', '__gathered__'\) overlap"))
