"""``ckptfs fill SKELETON --from SRC``: every tensor of SRC written into the storage SKELETON reserves under the
same key (a file ``torch.serialization.skip_data`` saved), in place, through ``Checkpoint.write``.

Every tensor of SRC is matched and checked (key, dtype, shape, writable) before a byte is written: a refusal
leaves SKELETON as it was. A tensor of SKELETON that is read-only because it views another one's bytes differently
(``w.t()`` beside ``w``) is not written: its storage must be covered by the tensors that are, and it is compared
with SRC's once they are. Bytes are copied a chunk at a time, so memory stays bounded whatever the sizes.
"""

from __future__ import annotations

import argparse
from typing import Any

from ckptfs.checkpoint import Checkpoint, open_checkpoint
from ckptfs.cli.cache_options import add_cache_options, cache_dir
from ckptfs.cli.remote_options import add_remote_options, remote_options
from ckptfs.cli.tensor_keys import dotted_key
from ckptfs.errors import CkptfsError
from ckptfs.gc_pause import gc_paused
from ckptfs.model.records import Tensor

CHUNK = 8 << 20
"""Bytes read and written at a time."""


def add_fill_parser(sub: Any) -> argparse.ArgumentParser:
    fill = sub.add_parser(
        "fill", usage="%(prog)s [options] SKELETON --from SRC",
        help="write every tensor of SRC into the storage a skip_data SKELETON reserves under the same key",
        description="Write every tensor of SRC (any checkpoint ckptfs reads: a path or a URL) into the storage "
                    "SKELETON (a local torch.save zip, e.g. saved under torch.serialization.skip_data) reserves "
                    "under the same key, in place; each record gets its CRC-32 once all its bytes are written. "
                    "Dtypes and shapes must match; every tensor is checked before anything is written.")
    fill.add_argument("skeleton", metavar="SKELETON", help="the torch.save zip to write into")
    fill.add_argument("--from", dest="source", metavar="SRC", required=True, help="the checkpoint to copy from")
    add_remote_options(fill)
    add_cache_options(fill)
    fill.set_defaults(run=cmd_fill)
    return fill


def cmd_fill(args: argparse.Namespace) -> int:
    with gc_paused(), open_checkpoint(args.source, args.limits, remote_options(args), cache_dir(args)) as source:
        with open_checkpoint(args.skeleton, args.limits, mode="r+") as skeleton:
            pairs, views = matched(source, skeleton)
            total = 0
            for tensor, reserved in pairs:
                total += copy(source, tensor, skeleton, reserved)
            for tensor, reserved in views:
                compare(source, tensor, skeleton, reserved)
    print(f"{args.skeleton}: {len(pairs):,} tensors filled, {total:,} bytes, from {args.source}")
    return 0


Pair = tuple[Tensor, Tensor]


def matched(source: Checkpoint, skeleton: Checkpoint) -> tuple[list[Pair], list[Pair]]:
    """Each tensor of ``source`` with data and the tensor ``skeleton`` has under its key, all checked: those to
    write, and the views of their bytes to compare afterwards."""
    writer = skeleton.writer
    assert writer is not None
    pairs: list[Pair] = []
    views: list[Pair] = []
    for tensor in source.tensors:
        if not tensor.has_data:
            continue
        key = dotted_key(list(tensor.path))
        try:
            reserved = skeleton.tensor(tensor.path)
        except (KeyError, TypeError, IndexError):
            raise CkptfsError(f"no tensor under key {key} (which {source.path} has)", skeleton.path) from None
        if reserved.dtype.name != tensor.dtype.name or reserved.shape != tensor.shape:
            raise CkptfsError(f"key {key}: {source.path} has {_spelled(tensor)}, the file reserves "
                              f"{_spelled(reserved)}", skeleton.path)
        (pairs if writer.writable(reserved) else views).append((tensor, reserved))
    covered: dict[int, list[tuple[int, int]]] = {}
    for _, reserved in pairs:
        target = writer.target(reserved)
        covered.setdefault(id(target.storage), []).append((target.start, target.start + target.length))
    for tensor, reserved in views:
        if reserved.storage is None or not _covers(covered.get(id(reserved.storage), []), reserved.storage.nbytes):
            writer.target(reserved)  # NotWritableError saying why
    return pairs, views


def _covers(ranges: list[tuple[int, int]], size: int) -> bool:
    end = 0
    for start, stop in sorted(ranges):
        if start > end:
            return False
        end = max(end, stop)
    return end >= size


def copy(source: Checkpoint, tensor: Tensor, skeleton: Checkpoint, reserved: Tensor) -> int:
    size = tensor.nbytes
    for offset in range(0, size, CHUNK):
        skeleton.write(reserved, source.read(tensor, offset, min(CHUNK, size - offset)), offset)
    return size


def compare(source: Checkpoint, tensor: Tensor, skeleton: Checkpoint, reserved: Tensor) -> None:
    size = tensor.nbytes
    for offset in range(0, size, CHUNK):
        length = min(CHUNK, size - offset)
        if source.read(tensor, offset, length) != skeleton.read(reserved, offset, length):
            raise CkptfsError(f"key {dotted_key(list(tensor.path))}: a view of other tensors' bytes, which now "
                              f"differs from {source.path}'s", skeleton.path)


def _spelled(tensor: Tensor) -> str:
    return f"{tensor.dtype.name} {list(tensor.shape)}"
