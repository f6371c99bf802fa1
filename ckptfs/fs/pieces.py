"""A file's content as a list of pieces, and which pieces cover a read.

A piece is literal bytes (a generated file, a header), a range of a tensor's
logical bytes (read through ``Checkpoint.read``: gathered, swapped or
inflated), or an extent of a source (bytes stored as they are, which an
adapter may hand over without copying: FUSE as file-descriptor buffers).
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, Callable, NamedTuple, Union

from ckptfs.model.records import Tensor
from ckptfs.reading.extents import Extent

if TYPE_CHECKING:
    from ckptfs.checkpoint import Checkpoint


class Literal(NamedTuple):
    data: bytes | bytearray

    @property
    def length(self) -> int:
        return len(self.data)


class TensorBytes(NamedTuple):
    tensor: Tensor
    offset: int
    """Into the tensor's logical bytes."""
    length: int


class SourceBytes(NamedTuple):
    extent: Extent

    @property
    def length(self) -> int:
        return self.extent.length


Piece = Union[Literal, TensorBytes, SourceBytes]


class Part(NamedTuple):
    """``length`` bytes of ``piece`` from ``start`` (relative to the piece)."""

    piece: Piece
    start: int
    length: int


class Content:
    """A file made of pieces, ``size`` bytes long (at most the sum of their lengths)."""

    __slots__ = ("pieces", "size", "_starts")

    def __init__(self, pieces: list[Piece], size: int | None = None) -> None:
        self.pieces = pieces
        starts, total = [], 0
        for piece in pieces:
            starts.append(total)
            total += piece.length
        self._starts = starts
        self.size = total if size is None else min(size, total)

    def cover(self, offset: int, size: int) -> list[Part]:
        """The parts of pieces holding bytes ``[offset, offset + size)``, clamped to the end of the file."""
        end = min(self.size, offset + size)
        parts: list[Part] = []
        if offset >= end:
            return parts
        index = bisect.bisect_right(self._starts, offset) - 1
        while offset < end:
            piece, start = self.pieces[index], self._starts[index]
            count = min(end, start + piece.length) - offset
            if count > 0:
                parts.append(Part(piece, offset - start, count))
                offset += count
            index += 1
        return parts


def part_bytes(checkpoint: Checkpoint, part: Part) -> bytes:
    """The bytes of one part: a source read, a read of the tensor's logical bytes, or a slice of literal bytes.

    Every adapter reads files through here (FUSE for what it cannot hand over as a file descriptor)."""
    return bytes(piece_bytes(part.piece, checkpoint.read, part.start, part.length))


def read_content(checkpoint: Checkpoint, content: Content, offset: int, size: int) -> bytes:
    """Bytes ``[offset, offset + size)`` of a file (fewer at its end), read from the pieces that hold them."""
    parts = content.cover(offset, size)
    if len(parts) == 1:
        return part_bytes(checkpoint, parts[0])
    return b"".join(part_bytes(checkpoint, part) for part in parts)


def tensor_pieces(tensor: Tensor, extents: list[Extent] | None) -> list[Piece]:
    """A tensor file's pieces: its stored extents when it has them, else its logical bytes to be gathered."""
    if extents is not None:
        return [SourceBytes(extent) for extent in extents]
    return [TensorBytes(tensor, 0, tensor.nbytes)]


def piece_bytes(piece: Piece, read: Callable[[Tensor, int, int], bytes], start: int = 0,
                length: int | None = None) -> bytes | bytearray:
    """``length`` bytes of a piece from ``start`` (to its end by default); ``read`` is ``Checkpoint.read``."""
    count = piece.length - start if length is None else length
    if isinstance(piece, Literal):
        return piece.data[start : start + count]
    if isinstance(piece, TensorBytes):
        return read(piece.tensor, piece.offset + start, count)
    return piece.extent.source.read(piece.extent.offset + start, count)
