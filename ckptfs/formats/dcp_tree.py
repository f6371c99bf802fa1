"""A DCP directory's nested state dict, made item by item from its ``.metadata``: each tensor item one ``Tensor``
whose ``chunks`` say where each box of it is stored, each bytes item the object its blob pickles.

The tree is the user's nested state dict rebuilt from ``planner_data`` paths (spec ``more-formats.md`` A.5): FQNs
are never split on dots, list indices stay ints. Items come from the records (``DcpTree.add_items``), or from the
compiled scanner's direct rows (``DcpTree.add_scanned``): those make the commonest tensor (one box of its size,
stored in a file that holds it, its path one key) with no record in between, and hand every other item to
``add_items``, so both give the same tree and the same errors.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from ckptfs.errors import CorruptCheckpointError, NoSuchObjectError
from ckptfs.formats.dcp_columns import Scanned
from ckptfs.formats.dcp_records import Box, DcpMetadata, ItemKey, StorageInfo, TensorItem
from ckptfs.model.records import Chunk, Key, Tensor, contiguous_strides
from ckptfs.pickle.cscan import rows
from ckptfs.sources import SourceSet

OVERLAP_CHECKED_CHUNKS = 256
"""Tensors of up to this many chunks are checked pairwise for overlaps on opening (the rest when read)."""


class DcpTree:
    """The tree of a directory's items as they are added, in the writer's order, and the tensors and chunks counted.
    ``bytes_item``: the object a bytes item's blob pickles (``DcpParsed.bytes_item``)."""

    def __init__(self, directory: SourceSet, bytes_item: Callable[[str, StorageInfo], Any], items: int) -> None:
        self.bytes_item = bytes_item
        self.builder = _TreeBuilder(items)
        self.files = _FileSizes(directory)
        self.strides: dict[tuple[int, ...], tuple[int, ...]] = {}
        self.tensors = self.chunks = 0

    def add_items(self, metadata: DcpMetadata, items: Iterable[tuple[str, TensorItem | None]]) -> None:
        bytes_item, files, strides = self.bytes_item, self.files, self.strides
        planner, root, stored_at, sizes = metadata.planner_data, self.builder.root, metadata.storage.get, files.sizes
        for fqn, item in items:
            path = planner.get(fqn, (fqn,)) if planner is not None else (fqn,)
            if item is None:
                value = bytes_item(fqn, _info(metadata, files, (fqn, None)))
            else:
                # Inline, the commonest tensor: one box of its size, stored in a file of known size that holds it.
                # Anything else (and every error) goes through _chunked_tensor.
                value = None
                boxes = item.chunks
                if len(boxes) == 1 and boxes[0].sizes == item.size:
                    box = boxes[0]
                    info = stored_at((fqn, box.offsets))
                    size = sizes.get(info.relative_path) if info is not None else None
                    if info is not None and type(size) is int and info.offset + info.length <= size:
                        stride = strides.get(item.size)
                        if stride is None:
                            stride = strides[item.size] = contiguous_strides(item.size)
                        value = Tensor(item.dtype, item.size, stride, 0, None, item.requires_grad, chunks=[
                            Chunk(box.offsets, box.sizes, info.relative_path, info.offset, info.length,
                                  info.transforms)])
                if value is None:
                    value = _chunked_tensor(fqn, item, metadata, files, strides)
                self.tensors += 1
                self.chunks += len(value.chunks)
            if len(path) == 1 and root.get(path[0]) is None:
                root[path[0]] = value
            else:
                self.builder.insert(path, value)

    def add_scanned(self, scanned: Scanned) -> None:
        """The items of the direct rows (``_cscan.h``): a tensor made here where ``add_items`` would make it
        inline, the records made (once) for any other item."""
        data, tables, dtypes, pool = scanned.data, scanned.tables, scanned.dtypes, scanned.tables["pool"]
        shapes = [tuple(pool[at : at + rank].tolist()) for at, rank in rows(tables["shapes"], 2)]
        strides = [self.strides.setdefault(shape, contiguous_strides(shape)) for shape in shapes]
        files = scanned.texts("files")
        known: list[Any] = [_UNASKED] * len(files)
        root, metadata, made = self.builder.root, None, 0
        for fqn_at, fqn_length, key_at, key_length, dtype, grad, shape, offsets, file, start, length in rows(
                tables["direct"], 11):
            if key_at >= 0:
                size = known[file]
                if size is _UNASKED:
                    size = known[file] = self.files.known(files[file])
                if type(size) is int and start + length <= size:
                    key = data[key_at : key_at + key_length].decode("ascii")
                    if root.get(key) is None:
                        sizes = shapes[shape]
                        root[key] = Tensor(dtypes[dtype], sizes, strides[shape], 0, None, grad == 1, chunks=[
                            Chunk(shapes[offsets], sizes, files[file], start, length)])
                        made += 1
                        continue
            if metadata is None:
                metadata = scanned.records()
            fqn = data[fqn_at : fqn_at + fqn_length].decode("ascii")
            self.add_items(metadata, ((fqn, metadata.items[fqn]),))
        self.tensors += made
        self.chunks += made

    @property
    def root(self) -> dict[Key, Any]:
        return self.builder.root


class _FileSizes:
    """The directory's member sizes, each asked for once (a 100,000-tensor directory has a few files)."""

    def __init__(self, directory: SourceSet) -> None:
        self.directory = directory
        self.sizes: dict[str, int | None | NoSuchObjectError] = {}

    def size(self, name: str) -> int | None:
        size = self.known(name)
        if isinstance(size, NoSuchObjectError):
            raise size
        return size

    def known(self, name: str) -> int | None | NoSuchObjectError:
        """The file's size, None when the directory does not say, or the error of a file that is not there."""
        size = self.sizes.get(name, _UNASKED)
        if size is _UNASKED:
            try:
                size = self.directory.member_size(name)
            except NoSuchObjectError as exc:
                size = exc
            self.sizes[name] = size
        return size  # type: ignore[no-any-return]


_UNASKED: Any = object()


def _info(metadata: DcpMetadata, files: _FileSizes, key: ItemKey) -> StorageInfo:
    info = metadata.storage.get(key)
    if info is None:
        where = f" at {list(key[1])}" if key[1] is not None else ""
        raise CorruptCheckpointError(f"{key[0]!r}{where} is not in storage_data")
    try:
        size = files.size(info.relative_path)
    except NoSuchObjectError:
        where = f" at {list(key[1])}" if key[1] is not None else ""
        raise CorruptCheckpointError(f"{key[0]!r}{where} is stored in {info.relative_path!r}, "
                                     "which is not in the directory") from None
    if size is not None and info.offset + info.length > size:
        where = f" at {list(key[1])}" if key[1] is not None else ""
        raise CorruptCheckpointError(f"{key[0]!r}{where} is stored at [{info.offset}, {info.offset + info.length}) "
                                     f"of {info.relative_path!r}, which has {size} bytes")
    return info


def _chunked_tensor(fqn: str, item: TensorItem, metadata: DcpMetadata, files: _FileSizes,
                    strides: dict[tuple[int, ...], tuple[int, ...]]) -> Tensor:
    boxes = item.chunks
    # One box of the tensor's size covers it (a box lies inside its tensor: dcp_records.checked_box).
    whole = len(boxes) == 1 and boxes[0].sizes == item.size
    if not whole:
        numel = math.prod(item.size)
        covered = sum(math.prod(box.sizes) for box in boxes)
        if covered != numel:
            raise CorruptCheckpointError(f"the chunks of tensor {fqn!r} hold {covered} elements, its size "
                                         f"{list(item.size)} has {numel}")
    chunks = []
    for box in boxes:
        info = _info(metadata, files, (fqn, box.offsets))
        chunks.append(Chunk(box.offsets, box.sizes, info.relative_path, info.offset, info.length, info.transforms))
    if not whole and len(chunks) <= OVERLAP_CHECKED_CHUNKS:
        check_disjoint(fqn, boxes)
    stride = strides.get(item.size)
    if stride is None:
        stride = strides[item.size] = contiguous_strides(item.size)
    return Tensor(item.dtype, item.size, stride, 0, None, item.requires_grad, chunks=chunks)


def check_disjoint(fqn: str, boxes: list[Box]) -> None:
    for i, a in enumerate(boxes):
        for b in boxes[:i]:
            if all(ao < bo + bs and bo < ao + as_ for ao, as_, bo, bs in zip(a.offsets, a.sizes, b.offsets, b.sizes)) \
                    and math.prod(a.sizes) and math.prod(b.sizes):
                raise CorruptCheckpointError(f"chunks of tensor {fqn!r} at {list(a.offsets)} and {list(b.offsets)} "
                                             "overlap")


class _TreeBuilder:
    """The nested state dict, as torch's ``_traverse.set_element`` rebuilds it: an int key makes a list."""

    def __init__(self, items: int) -> None:
        self.root: dict[Key, Any] = {}
        self.max_index = items

    def insert(self, path: tuple[str | int, ...], value: Any) -> None:
        container: Any = self.root
        for key, next_key in zip(path, path[1:]):
            child = self._get(container, key, path)
            if child is None:
                child = {} if isinstance(next_key, str) else []
                self._set(container, key, child, path)
            elif not isinstance(child, (dict, list)) or isinstance(child, list) != isinstance(next_key, int):
                raise CorruptCheckpointError(f"planner_data path {list(path)} passes through a "
                                             f"{type(child).__name__} at {key!r}")
            container = child
        if self._get(container, path[-1], path) is not None:
            raise CorruptCheckpointError(f"planner_data path {list(path)} is given twice")
        self._set(container, path[-1], value, path)

    def _get(self, container: Any, key: str | int, path: tuple[str | int, ...]) -> Any:
        if isinstance(container, dict):
            return container.get(key)
        self._index(key, path)
        return container[key] if key < len(container) else None  # type: ignore[operator]

    def _set(self, container: Any, key: str | int, value: Any, path: tuple[str | int, ...]) -> None:
        if isinstance(container, dict):
            container[key] = value
            return
        index = self._index(key, path)
        container.extend([None] * (index + 1 - len(container)))
        container[index] = value

    def _index(self, key: str | int, path: tuple[str | int, ...]) -> int:
        if not isinstance(key, int) or not 0 <= key < self.max_index:
            raise CorruptCheckpointError(f"planner_data path {list(path)} has the list index {key!r}, not one "
                                         f"below the {self.max_index} items")
        return key
