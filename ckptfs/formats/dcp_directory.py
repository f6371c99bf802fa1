"""Opens a torch.distributed.checkpoint directory: its metadata, the nested tree (``dcp_tree``), chunked tensors.

A tensor item becomes one ``Tensor`` whose ``chunks`` say where each box
of it is stored; a chunk's blob (a complete torch.save archive) is parsed on
its first read. Bytes items (pickled objects, which may hold tensors) are
parsed on opening through the restricted interpreter. Without a ``.metadata``
(saved with ``use_collectives=False``) the per-rank metadata files are merged.
One ``.metadata`` the compiled scanner reads is made into the tree from its rows (``dcp_columns.scan``).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ckptfs.errors import (
    CorruptCheckpointError,
    LimitExceededError,
    NotACheckpointError,
    UnsupportedError,
)
from ckptfs.formats import dcp, dcp_columns, zip_checkpoint
from ckptfs.formats.dcp_metadata import DcpMetadata, ItemKey, StorageInfo, TensorItem, parse_metadata, parse_pickled
from ckptfs.formats.dcp_transforms import RecentBlobs, decoded_blob
from ckptfs.formats.dcp_tree import DcpTree
from ckptfs.formats.interface import ParsedCheckpoint
from ckptfs.formats.prefetch import Prefetch
from ckptfs.limits import Limits
from ckptfs.model.dtypes import dtype_by_name
from ckptfs.model.records import Chunk, Storage, Tensor
from ckptfs.sources import ByteSource, SourceSet, WindowSource

GLOBAL_METADATA = ".metadata"
_RANK_METADATA = re.compile(r"__(\d+)\.metadata")
FORMAT = "dcp"


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
    scanned = metadata = None
    if len(files) == 1:
        data = _metadata_bytes(directory, files[0], limits)
        scanned = dcp_columns.scan(data, limits)
        if scanned is None:
            metadata = _parsed(files[0], data, limits, parse_pickled)
        elif not scanned.direct:
            metadata = scanned.records()
    else:
        metadata = _merged([_parsed(name, _metadata_bytes(directory, name, limits), limits) for name in files])
    if metadata is None:
        assert scanned is not None
        stored, version, items = len(scanned.tables["files"]) // 2, scanned.version, len(scanned.tables["items"]) // 3
    else:
        stored = len({info.relative_path for info in metadata.storage.values()})
        version, items = metadata.version, len(metadata.items)
    parsed = DcpParsed(FORMAT, {}, [], details={
        "metadata_files": files, "files": len(files) + stored, "version": version,
    }, directory=directory, limits=limits)
    tree = DcpTree(directory, parsed.bytes_item, items)
    if metadata is None:
        assert scanned is not None
        tree.add_scanned(scanned)
    else:
        tree.add_items(metadata, metadata.items.items())
    parsed.root = tree.root
    parsed.details.update(chunked_tensors=tree.tensors, chunks=tree.chunks)
    if metadata is not None and metadata.torch_1_13:
        parsed.details["written_by"] = "torch 1.13's torch.distributed._shard.checkpoint"
    return parsed


def _metadata_bytes(directory: SourceSet, name: str, limits: Limits) -> bytes:
    source = directory.open(name)
    if source.size > limits.max_pickle_bytes:
        raise LimitExceededError(f"{name} of {source.size} bytes exceeds {limits.max_pickle_bytes} "
                                 "(limit max_pickle_bytes)")
    return source.read(0, source.size)


def _parsed(name: str, data: bytes, limits: Limits,
            parse: Callable[[bytes, Limits], DcpMetadata] = parse_metadata) -> DcpMetadata:
    try:
        return parse(data, limits)
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
