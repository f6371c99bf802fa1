"""Opens a torch.distributed.checkpoint directory: its metadata, the nested tree, chunked tensors.

The tree is the user's nested state dict rebuilt from ``planner_data`` paths
(spec ``more-formats.md`` A.5): FQNs are never split on dots, list indices stay
ints. A tensor item becomes one ``Tensor`` whose ``chunks`` say where each box
of it is stored; a chunk's blob (a complete torch.save archive) is parsed on
its first read. Bytes items (pickled objects, which may hold tensors) are
parsed on opening through the restricted interpreter. Without a ``.metadata``
(saved with ``use_collectives=False``) the per-rank metadata files are merged.
"""

from __future__ import annotations

import math
import re
import threading
from dataclasses import dataclass, field
from typing import Any

from ckptfs.errors import (
    CorruptCheckpointError,
    LimitExceededError,
    NoSuchObjectError,
    NotACheckpointError,
    UnsupportedError,
)
from ckptfs.formats import dcp, zip_checkpoint
from ckptfs.formats.dcp_metadata import Box, DcpMetadata, ItemKey, StorageInfo, TensorItem, parse_metadata
from ckptfs.formats.dcp_transforms import RecentBlobs, decoded_blob
from ckptfs.formats.interface import ParsedCheckpoint
from ckptfs.formats.prefetch import Prefetch
from ckptfs.limits import Limits
from ckptfs.model.dtypes import dtype_by_name
from ckptfs.model.records import Chunk, Key, Storage, Tensor, contiguous_strides
from ckptfs.sources import ByteSource, SourceSet, WindowSource

GLOBAL_METADATA = ".metadata"
_RANK_METADATA = re.compile(r"__(\d+)\.metadata")
FORMAT = "dcp"
OVERLAP_CHECKED_CHUNKS = 256
"""Tensors of up to this many chunks are checked pairwise for overlaps on opening (the rest when read)."""


def metadata_files(directory: SourceSet) -> list[str]:
    """The directory's metadata pickles, by content: ``.metadata`` alone when it is one (no listing needed),
    else every one found in a listing (per-rank files, in rank order). Names ending in ``.metadata`` are looked
    at first, and only they where each look costs a request (``SourceSet.probe_all``)."""
    if dcp.is_metadata_head(directory.head(GLOBAL_METADATA, dcp.HEAD_BYTES)):
        return [GLOBAL_METADATA]
    names = sorted(directory.names(), key=_metadata_order)[: dcp.MAX_FILES]
    found = []
    for name in names:
        if not name.endswith(".metadata") and (found or not directory.probe_all):
            break
        if dcp.is_metadata_head(directory.head(name, dcp.HEAD_BYTES)):
            if name == GLOBAL_METADATA:
                return [name]
            found.append(name)
    return found


def _metadata_order(name: str) -> tuple[int, int, str]:
    rank = _RANK_METADATA.fullmatch(name)
    return (0 if name == GLOBAL_METADATA else 1 if rank else 2 if name.endswith(".metadata") else 3,
            int(rank.group(1)) if rank else 0, name)


NOT_A_CHECKPOINT_DIRECTORY = ("a directory, but no checkpoint directory: those read are DCP's (a .metadata file, "
                              "torch.distributed.checkpoint) and directories of .safetensors files (Hugging Face "
                              "shards)")


def open_dcp(directory: SourceSet, limits: Limits) -> DcpParsed:
    files = metadata_files(directory)
    if not files:
        raise NotACheckpointError(NOT_A_CHECKPOINT_DIRECTORY)
    metadata = _merged([_read_metadata(directory, name, limits) for name in files])
    stored = {info.relative_path for info in metadata.storage.values()}
    parsed = DcpParsed(FORMAT, {}, [], details={
        "metadata_files": files, "files": len(files) + len(stored), "version": metadata.version,
    }, directory=directory, limits=limits)
    builder = _TreeBuilder(len(metadata.items))
    tensors = chunks = 0
    file_sizes = _FileSizes(directory)
    strides: dict[tuple[int, ...], tuple[int, ...]] = {}
    planner, root, stored_at, sizes = metadata.planner_data, builder.root, metadata.storage.get, file_sizes.sizes
    for fqn, item in metadata.items.items():
        path = planner.get(fqn, (fqn,)) if planner is not None else (fqn,)
        if item is None:
            value = parsed.bytes_item(fqn, _info(metadata, file_sizes, (fqn, None)))
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
                        Chunk(box.offsets, box.sizes, info.relative_path, info.offset, info.length, info.transforms)])
            if value is None:
                value = _chunked_tensor(fqn, item, metadata, file_sizes, strides)
            tensors += 1
            chunks += len(value.chunks)
        if len(path) == 1 and root.get(path[0]) is None:
            root[path[0]] = value
        else:
            builder.insert(path, value)
    parsed.root = builder.root
    parsed.details.update(chunked_tensors=tensors, chunks=chunks)
    if metadata.torch_1_13:
        parsed.details["written_by"] = "torch 1.13's torch.distributed._shard.checkpoint"
    return parsed


def _read_metadata(directory: SourceSet, name: str, limits: Limits) -> DcpMetadata:
    source = directory.open(name)
    if source.size > limits.max_pickle_bytes:
        raise LimitExceededError(f"{name} of {source.size} bytes exceeds {limits.max_pickle_bytes} "
                                 "(limit max_pickle_bytes)")
    try:
        return parse_metadata(source.read(0, source.size), limits)
    except CorruptCheckpointError as exc:
        raise type(exc)(f"{name}: {exc.reason}") from None


def _merged(parts: list[DcpMetadata]) -> DcpMetadata:
    """The union of per-rank metadata: items seen on several ranks once, their chunks deduplicated by offsets."""
    if len(parts) == 1:
        return parts[0]
    items: dict[str, TensorItem | None] = {}
    planner: dict[str, tuple[str | int, ...]] | None = None
    storage: dict[ItemKey, StorageInfo] = {}
    for part in parts:
        for fqn, item in part.items.items():
            known = items.setdefault(fqn, item)
            if item is None or known is None:
                if (item is None) != (known is None):
                    raise CorruptCheckpointError(f"{fqn!r} is a tensor on one rank and an object on another")
                continue
            if known is not item:
                items[fqn] = _merged_item(fqn, known, item)
        if part.planner_data is not None:
            planner = planner or {}
            for fqn, path in part.planner_data.items():
                if planner.setdefault(fqn, path) != path:
                    raise CorruptCheckpointError(f"ranks disagree on where {fqn!r} is in the state dict")
        for key, info in part.storage.items():
            storage.setdefault(key, info)
    return DcpMetadata(items, planner, storage, parts[0].version, parts[0].torch_1_13)


def _merged_item(fqn: str, known: TensorItem, other: TensorItem) -> TensorItem:
    if (known.dtype, known.size) != (other.dtype, other.size):
        raise CorruptCheckpointError(f"ranks disagree on tensor {fqn!r}: {known.dtype.name}{list(known.size)} "
                                     f"and {other.dtype.name}{list(other.size)}")
    boxes = {box.offsets: box for box in known.chunks}
    for box in other.chunks:
        if boxes.setdefault(box.offsets, box) != box:
            raise CorruptCheckpointError(f"ranks disagree on the chunk of {fqn!r} at {box.offsets}")
    return known._replace(chunks=list(boxes.values()))


class _FileSizes:
    """The directory's member sizes, each asked for once (a 100,000-tensor directory has a few files)."""

    def __init__(self, directory: SourceSet) -> None:
        self.directory = directory
        self.sizes: dict[str, int | None | NoSuchObjectError] = {}

    def size(self, name: str) -> int | None:
        size = self.sizes.get(name, _UNASKED)
        if size is _UNASKED:
            try:
                size = self.directory.member_size(name)
            except NoSuchObjectError as exc:
                size = exc
            self.sizes[name] = size
        if isinstance(size, NoSuchObjectError):
            raise size
        return size  # type: ignore[return-value]


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


@dataclass
class DcpParsed(ParsedCheckpoint):
    """A DCP directory's parse. Blobs (each a torch.save archive in a file) are parsed once; their
    storages are moved to the file's offsets, so extents and zero-copy reads name the ``.distcp`` itself."""

    directory: SourceSet = field(kw_only=True)
    limits: Limits = field(kw_only=True)
    _blobs: dict[int, ParsedCheckpoint] = field(default_factory=dict, kw_only=True)
    """The blob parse a compressed storage came from, by the storage's id (for ``inflate``)."""
    _lock: threading.Lock = field(default_factory=threading.Lock, kw_only=True)
    _recent: RecentBlobs = field(init=False)

    def __post_init__(self) -> None:
        self._recent = RecentBlobs(self.limits.max_inflated_bytes)

    def bytes_item(self, fqn: str, info: StorageInfo) -> Any:
        """The object a bytes item pickles (its tensors' storages recorded among this checkpoint's)."""
        root, storages = self._parse_blob(info.relative_path, info.offset, info.length, info.transforms,
                                          f"item {fqn!r}", None)
        self.storages.extend(storages)
        return root

    def chunk_tensor(self, chunk: Chunk, dtype_name: str) -> Tensor:
        if chunk.tensor is not None:
            return chunk.tensor
        with self._lock:
            if chunk.tensor is None:
                where = f"the chunk at {list(chunk.offsets)}"
                data_bytes = chunk.numel * self._itemsize(dtype_name)
                root, _ = self._parse_blob(chunk.file, chunk.start, chunk.length, chunk.transforms, where, data_bytes)
                if not isinstance(root, Tensor) or not root.has_data or root.storage is None:
                    raise CorruptCheckpointError(f"{where} in {chunk.file!r} holds a {type(root).__name__}, "
                                                 "not a tensor")
                if root.dtype.name != dtype_name or root.shape != chunk.sizes:
                    raise CorruptCheckpointError(
                        f"{where} in {chunk.file!r} holds a {root.dtype.name} tensor of size {list(root.shape)}, "
                        f"not {dtype_name} of size {list(chunk.sizes)}")
                chunk.tensor = root
        return chunk.tensor

    @staticmethod
    def _itemsize(dtype_name: str) -> int:
        dtype = dtype_by_name(dtype_name)
        assert dtype is not None
        return dtype.itemsize

    def _parse_blob(self, name: str, start: int, length: int, transforms: tuple[str, ...], what: str,
                    data_bytes: int | None) -> tuple[Any, list[Storage]]:
        file = self.directory.open(name)
        blob: ByteSource = WindowSource(file, start, length, f"{name}[{start}:{start + length}]")
        try:
            if transforms:
                blob = decoded_blob(blob, transforms, self.limits, self._recent, data_bytes)
            head = blob.read(0, min(blob.size, 9))
            if len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < blob.size + (1 << 30):
                raise UnsupportedError(f"{what} is stored in safetensors form in {name!r} (saved with "
                                       "serialization_format=SAFETENSORS), which ckptfs does not read")
            parsed = zip_checkpoint.open_zip(Prefetch(blob), self.limits)
            for storage in parsed.storages:
                parsed.verify(storage)  # now: the parse is not kept (its archive holds up to 128 KiB of tail)
        except NotACheckpointError as exc:
            raise CorruptCheckpointError(f"{what} in {name!r} at [{start}, {start + length}) is not a torch.save "
                                         f"archive ({exc.reason})") from None
        except CorruptCheckpointError as exc:
            raise type(exc)(f"{what} in {name!r} at [{start}, {start + length}): {exc.reason}") from None
        for storage in parsed.storages:
            if storage.source is blob and isinstance(blob, WindowSource):
                storage.source = file
                storage.offset += start
            if storage.compressed:
                self._blobs[id(storage)] = parsed
        return parsed.root, parsed.storages

    def read_inflated(self, storage: Storage, offset: int, length: int) -> bytes:
        blob = self._blobs.get(id(storage))
        if blob is None:
            return super().read_inflated(storage, offset, length)
        return blob.read_inflated(storage, offset, length)
