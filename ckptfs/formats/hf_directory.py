"""Directories of safetensors files: what ``HuggingFaceStorageWriter`` (torch.distributed.checkpoint) writes, and
the sharded layout of HuggingFace ``save_pretrained`` it follows (spec ``more-formats.md`` A.8.2).

The files are recognised by content (an 8-byte header length, then the JSON header), every one in the directory
itself; ``model.safetensors.index.json``, when present, orders the tensors by its ``weight_map`` and names files
that ought to be safetensors. The tree is flat, ``{fqn: tensor}`` (the writer saves flattened names, which are
never split on dots), every tensor a stored range of its file. ``DCP_SHARDING_INFO`` in a header gives each
tensor's place in the whole one: offsets other than zeros mark a rank's shard of a distributed save without
consolidation, which is refused naming the form; so is a file whose safetensors header follows a torch.save blob
(torch 2.13 writes a non-tensor item that way, and no reader takes it).
"""

from __future__ import annotations

import json
from typing import Any

from ckptfs.errors import CkptfsError, CorruptCheckpointError, LimitExceededError, UnsupportedError
from ckptfs.formats import dcp, safetensors_file
from ckptfs.formats.interface import ParsedCheckpoint
from ckptfs.formats.prefetch import Prefetch
from ckptfs.limits import Limits
from ckptfs.model.records import Storage
from ckptfs.pickle.values import short_repr
from ckptfs.sources import SourceSet

FORMAT = "safetensors_dir"
INDEX = "model.safetensors.index.json"
SHARDING_INFO = "DCP_SHARDING_INFO"
HEAD = safetensors_file.HEADER_LENGTH.size + 1


def safetensors_members(directory: SourceSet) -> list[str]:
    """The directory's files that begin like a safetensors file (of the first ``dcp.MAX_FILES``), in name order."""
    names = directory.names()
    found = []
    for name in list(names)[: dcp.MAX_FILES]:
        head = directory.head(name, HEAD)
        if len(head) == HEAD and head[8:9] == b"{":
            length = int.from_bytes(head[:8], "little")
            if 2 <= length <= names[name] - safetensors_file.HEADER_LENGTH.size:
                found.append(name)
    return found


def is_safetensors_directory(directory: SourceSet, members: list[str]) -> bool:
    return bool(members) or INDEX in directory.names()


def open_safetensors_directory(directory: SourceSet, members: list[str], limits: Limits) -> ParsedCheckpoint:
    index = _index(directory, limits)
    listed = list(dict.fromkeys(index.values())) if index is not None else []
    for name in listed:
        if name not in members:
            raise _unreadable(directory, name)
    tensors: dict[str, Any] = {}
    storages: list[Storage] = []
    for name in [*listed, *(m for m in members if m not in listed)]:
        parsed = _open_file(directory, name, limits)
        for fqn, tensor in parsed.root.items():
            if fqn in tensors:
                raise CorruptCheckpointError(f"tensor {fqn!r} is in two files (the second: {name!r})")
            tensors[fqn] = tensor
        storages.extend(parsed.storages)
        if len(storages) > limits.max_tensors:
            raise LimitExceededError(f"the files name more than {limits.max_tensors} tensors (limit max_tensors)")
    if index is not None:
        missing = [fqn for fqn in index if fqn not in tensors]
        if missing:
            raise CorruptCheckpointError(f"{INDEX} lists {missing[0]!r} in {index[missing[0]]!r}, which lacks it")
        tensors = {**{fqn: tensors[fqn] for fqn in index}, **tensors}
    details = {"files": len(directory.names()), "safetensors_files": len(listed) + len(set(members) - set(listed)),
               "index": index is not None}
    return ParsedCheckpoint(FORMAT, tensors, storages, "little", details)


def _open_file(directory: SourceSet, name: str, limits: Limits) -> ParsedCheckpoint:
    try:
        parsed = safetensors_file.open_safetensors(Prefetch(directory.open(name)), limits)
        _check_whole(parsed)
    except CkptfsError as exc:
        raise type(exc)(f"{name}: {exc.reason}") from None
    return parsed


def _check_whole(parsed: ParsedCheckpoint) -> None:
    """Every tensor is whole: ``DCP_SHARDING_INFO``, when given, puts it at offsets of zeros."""
    metadata = parsed.details.get("metadata") or {}
    text = metadata.get(SHARDING_INFO)
    if not isinstance(text, str):
        return
    try:
        sharding = json.loads(text)
    except (ValueError, RecursionError):
        raise CorruptCheckpointError(f"{SHARDING_INFO} is not JSON") from None
    if not isinstance(sharding, dict):
        raise CorruptCheckpointError(f"{SHARDING_INFO} is {short_repr(sharding)}, not an object")
    for fqn, info in sharding.items():
        offsets = info.get("saved_offsets") if isinstance(info, dict) else None
        if not isinstance(offsets, list) or not all(type(o) is int for o in offsets):
            raise CorruptCheckpointError(f"{SHARDING_INFO} of {short_repr(fqn)} is {short_repr(info)}, not "
                                         "{saved_offsets: [int, ...]}")
        if any(offsets):
            raise UnsupportedError(f"tensor {short_repr(fqn)} is a shard at {offsets} of a distributed "
                                   "HuggingFaceStorageWriter save without consolidation, which ckptfs does not "
                                   "reassemble")


def _index(directory: SourceSet, limits: Limits) -> dict[str, str] | None:
    """``weight_map`` of the index file: fqn → file name."""
    size = directory.names().get(INDEX)
    if size is None:
        return None
    if size > limits.max_pickle_bytes:
        raise LimitExceededError(f"{INDEX} of {size} bytes exceeds {limits.max_pickle_bytes} "
                                 "(limit max_pickle_bytes)")
    try:
        index = json.loads(directory.open(INDEX).read(0, size))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CorruptCheckpointError(f"{INDEX} is not JSON: {exc}") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in weight_map.items()):
        raise CorruptCheckpointError(f"{INDEX} has no weight_map of names to file names")
    return weight_map


def _unreadable(directory: SourceSet, name: str) -> CkptfsError:
    if name not in directory.names():
        return CorruptCheckpointError(f"{INDEX} lists {name!r}, which is not in the directory")
    if directory.head(name, 4) == b"PK\x03\x04":
        return UnsupportedError(f"{name!r} holds a torch.save blob before its safetensors header: "
                                "HuggingFaceStorageWriter wrote a non-tensor item into it (torch 2.13 does so "
                                "without an error), and no reader takes such a file")
    return CorruptCheckpointError(f"{INDEX} lists {name!r}, which is not a safetensors file")
