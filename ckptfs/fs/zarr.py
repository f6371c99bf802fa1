"""``/.zarr/``: the tree as a zarr v3 hierarchy, each tensor an array whose chunks are ranges of its file's bytes.

Every directory of the mount (a container at its first place) is a group
(``zarr.json``: ``{"zarr_format": 3, "node_type": "group"}``) at the same
path below ``/.zarr``; every tensor that has a ``.npy`` (``fs.npy``) is an
array there: ``zarr.json`` and its chunks, codec ``bytes`` (little-endian).
The chunk grid splits the first axis only, into chunks of whole rows of at most
``zarr_chunk`` bytes (``ZARR_CHUNK`` by default; one row a chunk when a row is
larger; 0: one chunk for the whole array), so that each chunk is one contiguous
range of the tensor file's bytes, read from the source as they are stored, and a
slice fetches only its chunks. Chunk keys use the ``default`` encoding with the
separator ``.`` (``c.0.0``, ``c.1.0`` … for a 2-d array; ``c`` for a 0-d one;
none when the array is empty): one flat directory per array. The last chunk is
padded with zeros to the chunk's shape, as zarr stores edge chunks. A tensor
of more than ``MAX_CHUNKS`` chunks gets larger chunks.
The data type is the ``.npy``'s (``bool``, ``int8`` … ``complex128``); dtypes
zarr v3 has no core type for (bfloat16, float8 …) are their raw bits as
``uint8``/``uint16``/``uint32``, the true dtype in the array's attributes
(``ckptfs_dtype``, always there). A tensor met again (tied weights) is a
symlink to its first place, as in the mount; other values are not shown.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ckptfs.fs.nodes import Dir, Kind, Node
from ckptfs.fs.npy import npy_dtype
from ckptfs.fs.pieces import Literal, Piece, SourceBytes, TensorBytes
from ckptfs.model.records import Tensor
from ckptfs.reading.extents import Extent

ZARR_DIR = ".zarr"
METADATA_NAME = "zarr.json"
ZARR_INO = 1 << 48
"""A mirrored node's numbers are ``ZARR_INO + 4 * (its mount node's number) + ZarrPart``: apart from the tree's."""
ZARR_CHUNK = 4 << 20
"""Default chunk bytes: a slice of a large tensor fetches a few MiB, and a 1 GiB tensor is 256 keys."""
MAX_CHUNKS = 1 << 14
"""Chunks of one array at most: a chunk's inode number is ``CHUNK_INO + MAX_CHUNKS * (mount node's) + index``."""
CHUNK_INO = 1 << 62
_KINDS = {"b": "bool", "i": "int", "u": "uint", "f": "float", "c": "complex"}
DOCUMENTS = 4096
"""Array documents remembered, by dtype and shape."""
_DOCUMENTS: dict[tuple[Any, tuple[int, ...], int], bytes] = {}
GROUP_DOCUMENT = (json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}) + "\n").encode()


class ZarrDir(Dir):
    """A group (``array`` False) or array directory below ``/.zarr``, mirroring the mount's ``node``; its arrays are
    chunked by ``chunk_bytes`` (``ZARR_CHUNK``)."""

    __slots__ = ("mirrors", "array", "chunk_bytes")

    def __init__(self, ino: int, name: str, parent: Dir | None, mirrors: Node, array: bool,
                 chunk_bytes: int = ZARR_CHUNK) -> None:
        super().__init__(ino, name, parent, mirrors.key, mirrors.value)
        self.mirrors = mirrors
        self.array = array
        self.chunk_bytes = chunk_bytes


class ZarrChunk(Node):
    """Chunk ``index`` of an array: rows ``index * rows`` on of its tensor (``value``)."""

    __slots__ = ("index", "rows")

    def __init__(self, ino: int, name: str, parent: Dir, tensor: Tensor, index: int, rows: int) -> None:
        super().__init__(ino, Kind.ZARR_CHUNK, name, parent, None, tensor)
        self.index = index
        self.rows = rows


def zarr_data_type(tensor: Tensor) -> str | None:
    """The array's zarr v3 data type; None when the tensor is no array."""
    found = npy_dtype(tensor)
    if found is None:
        return None
    descr = found[0]
    kind = _KINDS[descr[1]]
    return kind if kind == "bool" else f"{kind}{int(descr[2:]) * 8}"


def chunk_rows(tensor: Tensor, chunk_bytes: int) -> int:
    """Rows of the first axis in a chunk (1 for a 0-d array): as many whole rows as ``chunk_bytes`` holds, at least
    one, all of them when ``chunk_bytes`` is 0; enough that there are at most ``MAX_CHUNKS`` chunks."""
    if not tensor.shape:
        return 1
    count = tensor.shape[0]
    row = tensor.nbytes // count if count else 0
    rows = count if chunk_bytes <= 0 or row == 0 else chunk_bytes // row
    return max(1, rows, -(-count // MAX_CHUNKS))


def chunk_names(tensor: Tensor, rows: int) -> list[str]:
    """The chunks' keys in order; none for an empty array."""
    if tensor.nbytes == 0:
        return []
    if not tensor.shape:
        return ["c"]
    rest = ".0" * (len(tensor.shape) - 1)
    return [f"c.{index}{rest}" for index in range(-(-tensor.shape[0] // rows))]


def chunk_size(chunk: ZarrChunk) -> int:
    """A chunk's bytes: ``rows`` rows, the last chunk's padding included."""
    tensor: Tensor = chunk.value
    return tensor.nbytes if not tensor.shape else tensor.nbytes // tensor.shape[0] * chunk.rows


def chunk_pieces(chunk: ZarrChunk, whole: list[Piece]) -> list[Piece]:
    """A chunk's pieces, from those of its tensor's file (``whole``): its rows' range, then zeros to pad the last."""
    size = chunk_size(chunk)
    start = size * chunk.index
    stop = min(start + size, chunk.value.nbytes)
    found: list[Piece] = []
    at = 0
    for piece in whole:
        first, last = max(start, at), min(stop, at + piece.length)
        if first < last:
            found.append(_piece_range(piece, first - at, last - first))
        at += piece.length
    if stop - start < size:
        found.append(Literal(bytes(size - (stop - start))))
    return found


def _piece_range(piece: Piece, start: int, length: int) -> Piece:
    if isinstance(piece, Literal):
        return Literal(piece.data[start : start + length])
    if isinstance(piece, TensorBytes):
        return TensorBytes(piece.tensor, piece.offset + start, length)
    extent = piece.extent
    return SourceBytes(Extent(extent.source, extent.offset + start, length))


def array_document(tensor: Tensor, rows: int) -> bytes:
    """An array's ``zarr.json``: one per dtype, shape and chunk rows, remembered (a model has few distinct ones)."""
    key = (tensor.dtype, tensor.shape, rows)
    made = _DOCUMENTS.get(key)
    if made is None:
        if len(_DOCUMENTS) >= DOCUMENTS:
            _DOCUMENTS.clear()
        made = _DOCUMENTS[key] = _array_document(tensor, rows)
    return made


def _array_document(tensor: Tensor, rows: int) -> bytes:
    data_type = zarr_data_type(tensor)
    assert data_type is not None
    fill: Any = False if data_type == "bool" else [0.0, 0.0] if data_type.startswith("complex") else 0
    codec: dict[str, Any] = {"name": "bytes"}
    if tensor.itemsize > 1:
        codec["configuration"] = {"endian": "little"}
    document = {
        "zarr_format": 3, "node_type": "array", "shape": list(tensor.shape), "data_type": data_type,
        "chunk_grid": {"name": "regular", "configuration": {
            "chunk_shape": [max(1, n) for n in (rows, *tensor.shape[1:])][: len(tensor.shape)]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "."}},
        "fill_value": fill, "codecs": [codec], "attributes": {"ckptfs_dtype": tensor.dtype.name},
    }
    return (json.dumps(document) + "\n").encode()


class ZarrLink(Node):
    """A symlink below ``/.zarr`` where the mount has one (``mirrors``): the same target, mirrored."""

    __slots__ = ("mirrors",)

    def __init__(self, ino: int, parent: Dir, mirrors: Node) -> None:
        super().__init__(ino, Kind.LINK, mirrors.name, parent, mirrors.key, mirrors.value)
        self.mirrors = mirrors


def document(node: Node) -> bytes:
    """A ``zarr.json``'s bytes."""
    if node.value is None:
        return GROUP_DOCUMENT
    assert isinstance(node.parent, ZarrDir)
    return array_document(node.value, chunk_rows(node.value, node.parent.chunk_bytes))


def mirror_entries(directory: ZarrDir, children: Sequence[Node]) -> list[Node]:
    """The entries of a ``/.zarr`` directory, from the children of the mount directory it mirrors (a group) or
    from its tensor (an array)."""
    base = ZARR_INO + 4 * directory.mirrors.ino
    if directory.array:
        tensor: Tensor = directory.value
        found: list[Node] = [Node(base + 1, Kind.ZARR, METADATA_NAME, directory, None, tensor)]
        rows = chunk_rows(tensor, directory.chunk_bytes)
        first = CHUNK_INO + MAX_CHUNKS * directory.mirrors.ino
        found += [ZarrChunk(first + index, name, directory, tensor, index, rows)
                  for index, name in enumerate(chunk_names(tensor, rows))]
        return found
    found = [Node(base + 1, Kind.ZARR, METADATA_NAME, directory, None, None)]
    for node in children:
        ino = ZARR_INO + 4 * node.ino
        if node.kind is Kind.DIR:
            found.append(ZarrDir(ino, node.name, directory, node, False, directory.chunk_bytes))
        elif node.kind is Kind.TENSOR and zarr_data_type(node.value) is not None:
            found.append(ZarrDir(ino, node.name, directory, node, True, directory.chunk_bytes))
        elif node.kind is Kind.LINK and (not isinstance(node.value, Tensor) or zarr_data_type(node.value)):
            found.append(ZarrLink(ino + 3, directory, node))
    return found
