"""``/.zarr/``: the tree as a zarr v3 hierarchy, each tensor an array of one chunk whose bytes are its file's.

Every directory of the mount (a container at its first place) is a group
(``zarr.json``: ``{"zarr_format": 3, "node_type": "group"}``) at the same
path below ``/.zarr``; every tensor that has a ``.npy`` (``fs.npy``) is an
array there: ``zarr.json`` and one chunk covering the whole array, named
by the ``v2`` chunk key encoding (``0.0`` for a 2-d array, ``0`` for a 0-d
one, none when the array is empty), codec ``bytes`` (little-endian): the
chunk's bytes are the tensor file's, read from the source as they are stored.
The data type is the ``.npy``'s (``bool``, ``int8`` … ``complex128``); dtypes
zarr v3 has no core type for (bfloat16, float8 …) are their raw bits as
``uint8``/``uint16``/``uint32``, the true dtype in the array's attributes
(``ckptfs_dtype``, always there). A tensor met again (tied weights) is a
symlink to its first place, as in the mount; other values are not shown.
"""

from __future__ import annotations

import json
from typing import Any

from ckptfs.fs.nodes import Dir, Kind, Node
from ckptfs.fs.npy import npy_dtype
from ckptfs.model.records import Tensor

ZARR_DIR = ".zarr"
METADATA_NAME = "zarr.json"
ZARR_INO = 1 << 48
"""A mirrored node's numbers are ``ZARR_INO + 4 * (its mount node's number) + ZarrPart``: apart from the tree's."""
_KINDS = {"b": "bool", "i": "int", "u": "uint", "f": "float", "c": "complex"}
DOCUMENTS = 4096
"""Array documents remembered, by dtype and shape."""
_DOCUMENTS: dict[tuple[Any, tuple[int, ...]], bytes] = {}
GROUP_DOCUMENT = (json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}) + "\n").encode()


class ZarrDir(Dir):
    """A group (``array`` False) or array directory below ``/.zarr``, mirroring the mount's ``node``."""

    __slots__ = ("mirrors", "array")

    def __init__(self, ino: int, name: str, parent: Dir | None, mirrors: Node, array: bool) -> None:
        super().__init__(ino, name, parent, mirrors.key, mirrors.value)
        self.mirrors = mirrors
        self.array = array


def zarr_data_type(tensor: Tensor) -> str | None:
    """The array's zarr v3 data type; None when the tensor is no array."""
    found = npy_dtype(tensor)
    if found is None:
        return None
    descr = found[0]
    kind = _KINDS[descr[1]]
    return kind if kind == "bool" else f"{kind}{int(descr[2:]) * 8}"


def chunk_name(tensor: Tensor) -> str | None:
    """The only chunk's key; None for an empty array (it has no chunk)."""
    if tensor.nbytes == 0:
        return None
    return ".".join("0" for _ in tensor.shape) or "0"


def array_document(tensor: Tensor) -> bytes:
    """An array's ``zarr.json``: one per dtype and shape, remembered (a model has few distinct ones)."""
    key = (tensor.dtype, tensor.shape)
    made = _DOCUMENTS.get(key)
    if made is None:
        if len(_DOCUMENTS) >= DOCUMENTS:
            _DOCUMENTS.clear()
        made = _DOCUMENTS[key] = _array_document(tensor)
    return made


def _array_document(tensor: Tensor) -> bytes:
    data_type = zarr_data_type(tensor)
    assert data_type is not None
    fill: Any = False if data_type == "bool" else [0.0, 0.0] if data_type.startswith("complex") else 0
    codec: dict[str, Any] = {"name": "bytes"}
    if tensor.itemsize > 1:
        codec["configuration"] = {"endian": "little"}
    document = {
        "zarr_format": 3, "node_type": "array", "shape": list(tensor.shape), "data_type": data_type,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [max(1, n) for n in tensor.shape]}},
        "chunk_key_encoding": {"name": "v2", "configuration": {"separator": "."}},
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
    return GROUP_DOCUMENT if node.value is None else array_document(node.value)


def mirror_entries(directory: ZarrDir, children: list[Node]) -> list[Node]:
    """The entries of a ``/.zarr`` directory, from the children of the mount directory it mirrors (a group) or
    from its tensor (an array)."""
    base = ZARR_INO + 4 * directory.mirrors.ino
    if directory.array:
        tensor: Tensor = directory.value
        found: list[Node] = [Node(base + 1, Kind.ZARR, METADATA_NAME, directory, None, tensor)]
        chunk = chunk_name(tensor)
        if chunk is not None:
            found.append(Node(base + 2, Kind.ZARR_CHUNK, chunk, directory, None, tensor))
        return found
    found = [Node(base + 1, Kind.ZARR, METADATA_NAME, directory, None, None)]
    for node in children:
        ino = ZARR_INO + 4 * node.ino
        if node.kind is Kind.DIR:
            found.append(ZarrDir(ino, node.name, directory, node, array=False))
        elif node.kind is Kind.TENSOR and zarr_data_type(node.value) is not None:
            found.append(ZarrDir(ino, node.name, directory, node, array=True))
        elif node.kind is Kind.LINK and (not isinstance(node.value, Tensor) or zarr_data_type(node.value)):
            found.append(ZarrLink(ino + 3, directory, node))
    return found
