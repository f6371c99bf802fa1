"""What ``ckptfs info`` prints: an overview for people; with ``--json``, every tensor's metadata and the whole tree.

The JSON can be far bigger than the file: a long string referenced a
million times, or 10,000 tensors 990 keys deep. Its size is counted while it
is put together and refused past ``max_generated_bytes`` before the text is
made; each tensor's metadata is its sidecar's text (templates and cached key
paths), not re-encoded value by value, which would take seconds for such a file.
"""

from __future__ import annotations

import os
import re
from typing import Any

from ckptfs.checkpoint import Checkpoint
from ckptfs.cli.printable import printable
from ckptfs.counts import counted, plural
from ckptfs.errors import CkptfsError, LimitExceededError
from ckptfs.fs.describe import TextBudget, encode_tree, json_text, storage_metadata
from ckptfs.fs.pathtext import PathTexts
from ckptfs.fs.sidecar import SidecarMaker
from ckptfs.model.jsontext import dumps
from ckptfs.model.records import Tensor

FORMAT_NAMES = {
    "zip": "torch.save zip archive (torch >= 1.6)",
    "torchscript": "TorchScript archive (torch.jit.save)",
    "legacy": "legacy torch.save stream (torch < 1.6)",
    "tar": "legacy TAR checkpoint (torch <= 0.3)",
    "pt2": "torch.export archive (.pt2)",
    "safetensors": "safetensors file",
    "safetensors_dir": "directory of safetensors files (HuggingFaceStorageWriter, save_pretrained)",
    "dcp": "distributed checkpoint directory (torch.distributed.checkpoint, DCP)",
}
UNWRITTEN_SHOWN = 20
"""Storages ``ckptfs info`` lists by name when skip_data left them unwritten (``--json`` gives all)."""
_JSON_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[^\s"{}\[\],:]+|[{}\[\],:]|\s+')


def summary(ck: Checkpoint) -> dict[str, Any]:
    """The head of ``ckptfs info --json``."""
    return {
        "file": ck.path,
        "format": ck.format,
        "byteorder": ck.byteorder,
        "details": ck.details,
        "tensor_count": len(ck.tensors),
        "alias_count": ck.alias_count,
        "element_count": sum(t.numel for t in ck.tensors),
        "parameter_count": sum(t.numel for t in ck.tensors if t.is_parameter),
        "total_nbytes": sum(t.nbytes for t in ck.tensors),
    }


def description_text(ck: Checkpoint) -> str:
    """``ckptfs info --json``: the JSON text of the summary, every storage's place, every tensor's metadata and
    the whole tree.

    It equals ``json_text({**summary(ck), "storages": [storage_metadata(s) ...], "tensors": [tensor_metadata(t)
    ...], "tree": encode_tree(ck.root)})``. LimitExceededError (naming the file) past ``max_generated_bytes``.
    """
    budget = TextBudget(ck.limits.max_generated_bytes)
    sidecars = SidecarMaker(PathTexts(ck.limits.max_generated_bytes))
    try:
        storages = []
        for storage in ck.storages:
            storages.append(dumps(storage_metadata(storage)))
            budget.spend(len(storages[-1]))
        tensors = []
        for tensor in ck.tensors:
            text = sidecars(tensor).decode("ascii")[:-1]
            budget.spend(2 * len(text))  # in the tensor list, and once more in the tree
            tensors.append(text)
        # Each tensor of the tree stands as a marker no checkpoint can contain, replaced by its text at the end.
        marker = f"\x00ckptfs:tensor:{os.urandom(16).hex()}:"
        index = {id(tensor): n for n, tensor in enumerate(ck.tensors)}

        def stand_in(tensor: Tensor) -> str:
            return marker + str(index[id(tensor)])

        tree = json_text(encode_tree(ck.root, budget, stand_in))
    except CkptfsError as exc:
        raise exc.with_path(ck.path) from None
    quoted = re.escape(dumps(marker)[:-1]) + r'(\d+)"'
    tree = re.sub(quoted, lambda match: tensors[int(match.group(1))], tree)
    return (f'{dumps(summary(ck))[:-1]}, "storages": [{", ".join(storages)}], "tensors": [{", ".join(tensors)}], '
            f'"tree": {tree}}}')


def overview(ck: Checkpoint) -> list[str]:
    """``ckptfs info``: ``label:  value`` lines for people; lists continue on lines of their own, indented."""
    from ckptfs.cli.listing import human_size

    tensors = ck.tensors
    total = sum(t.nbytes for t in tensors)
    stored = sum(s.nbytes for s in ck.storages if s.base is None)
    parameters = [t for t in tensors if t.is_parameter]
    chunk_lines = _chunk_lines(tensors)
    aliases = f" (+{counted(ck.alias_count, 'alias')}: other places of the same tensors)" if ck.alias_count else ""
    fields: list[tuple[str, list[str]]] = [
        ("file", [ck.path]),
        ("format", [FORMAT_NAMES.get(ck.format, ck.format)]),
        ("size", [f"{human_size(total)} of tensor data ({total:,} bytes)"]),
        ("tensors", [f"{len(tensors):,}{aliases}"]),
        ("storages", [f"{len(ck.storages):,} ({human_size(stored)} stored)" if ck.storages or not chunk_lines
                      else "0: the tensors' data is in chunks"]),
        *chunk_lines,
        ("elements", [f"{sum(t.numel for t in tensors):,} in {counted(len(tensors), 'tensor')}"]),
        *([("parameters", [f"{sum(t.numel for t in parameters):,} in {counted(len(parameters), 'nn.Parameter')}"])]
          if parameters else []),
        ("dtypes", _dtype_lines(tensors) or ["none"]),
        ("byteorder", [ck.byteorder]),
        ("details", [f"{key.replace('_', ' ')}: {_detail(value)}" for key, value in ck.details.items()
                     if value is not None] or ["none"]),
    ]
    unwritten = [s for s in ck.storages if not s.written]
    if unwritten:
        fields.append(("unwritten", [f"{counted(len(unwritten), 'storage')} reserved by skip_data, bytes never "
                                     "written:",
                                     *(f"{s.key}: offset {s.offset:,}, {s.nbytes:,} bytes" for s in
                                       unwritten[:UNWRITTEN_SHOWN])]
                       + ([f"... {len(unwritten) - UNWRITTEN_SHOWN:,} more: ckptfs info --json"]
                          if len(unwritten) > UNWRITTEN_SHOWN else [])))
    width = max(len(label) for label, _ in fields) + 2
    lines = []
    for label, values in fields:
        lines.append(f"{label + ':':<{width}}{printable(values[0])}")
        lines.extend(" " * width + printable(value) for value in values[1:])
    return lines


def _chunk_lines(tensors: list[Tensor]) -> list[tuple[str, list[str]]]:
    """A chunked (DCP) tensor's data is in blobs, not storages: how many, in how many files, how many bytes."""
    from ckptfs.cli.listing import human_size

    every = [chunk for tensor in tensors if tensor.chunks is not None for chunk in tensor.chunks]
    chunks = [chunk for chunk in every if chunk.file]
    gathered = [t for t in tensors if t.chunks is not None and t.chunks and not t.chunks[0].file]
    shards = [("sharded", [f"{len(gathered):,} ShardedTensor{'s' if len(gathered) != 1 else ''} gathered from "
                           f"{len(every) - len(chunks):,} local shards (tensors listed too)"])] if gathered else []
    if not chunks:
        return shards
    files = len({chunk.file for chunk in chunks})
    stored = sum(chunk.length for chunk in chunks)
    line = (f"{len(chunks):,} of {sum(t.chunks is not None for t in tensors):,} tensors, torch.save blobs in "
            f"{counted(files, 'file')} ({human_size(stored)} stored)")
    encoded = [chunk for chunk in chunks if chunk.transforms]
    if encoded:
        line += f"; {len(encoded):,} compressed ({', '.join(sorted({t for c in encoded for t in c.transforms}))})"
    return [("chunks", [line]), *shards]


def _dtype_lines(tensors: list[Tensor]) -> list[str]:
    """``DTYPE  N tensors  SIZE``, the most bytes first."""
    from ckptfs.cli.listing import human_size

    counts: dict[str, list[int]] = {}
    for tensor in tensors:
        tally = counts.setdefault(tensor.dtype.name, [0, 0])
        tally[0] += 1
        tally[1] += tensor.nbytes
    rows = sorted(counts.items(), key=lambda item: (-item[1][1], -item[1][0], item[0]))
    name_width = max((len(name) for name, _ in rows), default=0)
    count_width = max((len(f"{count:,}") for _, (count, _) in rows), default=0)
    return [f"{name:<{name_width}}  {count:>{count_width},} {plural(count, 'tensor'):<7}  {human_size(nbytes)}"
            for name, (count, nbytes) in rows]


def _detail(value: Any) -> str:
    """A detail as people write it: lists as ``a, b``, mappings as ``key=value, ...``, never a Python repr."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return ", ".join(f"{_detail(key)}={_detail(item)}" for key, item in value.items()) or "none"
    if isinstance(value, (list, tuple)):
        return ", ".join(_detail(item) for item in value) or "none"
    return str(value)


def indented(text: str, indent: int, max_bytes: int) -> str:
    """The JSON ``text`` laid out as ``json.dumps(json.loads(text), indent=indent)`` would, without parsing it.

    Token by token, so no depth makes it recurse; LimitExceededError past
    ``max_bytes`` (indentation grows with depth: a deep tree can make the
    laid-out text many times longer than the compact one).
    """
    parts: list[str] = []
    size = 0
    depth = 0
    opened = ""
    """A ``[`` or ``{`` not written yet: followed by its closing bracket, it stays on its line (``[]``)."""
    for match in _JSON_TOKEN.finditer(text):
        token = match.group()
        first = token[0]
        if first.isspace():
            continue
        if opened:
            if first in "]}":
                parts.append(opened + token)
                size += 2
                opened = ""
                continue
            depth += 1
            token = opened + "\n" + " " * (indent * depth) + token
            opened = ""
        elif first in "[{":
            opened = token
            continue
        elif first in "]}":
            depth -= 1
            token = "\n" + " " * (indent * depth) + token
        elif first == ",":
            token = ",\n" + " " * (indent * depth)
        elif first == ":":
            token = ": "
        if token[-1] in "[{":
            opened, token = token[-1], token[:-1]
        parts.append(token)
        size += len(token)
        if size > max_bytes:
            raise LimitExceededError(f"the indented JSON description would exceed {max_bytes} bytes "
                                     "(limit max_generated_bytes)")
    parts.append(opened)
    return "".join(parts)
