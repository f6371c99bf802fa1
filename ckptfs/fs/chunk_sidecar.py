"""Sidecar families (``fs.sidecar``) of tensors stored whole as one chunk in a file: a DCP directory's commonest
tensor, 100,000 of them in a large MoE checkpoint, each listed with its sidecar's size.

Such tensors that differ only in where their chunk's archive is in its file (``range`` and ``source_ranges``) share
the rest of their sidecar: it is rendered once per family, with fields for the range's start and end, each
written twice (``"range": [start, end]`` and ``"source_ranges": [[file, start, end]]``).
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any

from ckptfs.fs.describe import tensor_metadata
from ckptfs.model.jsontext import decimal_lengths, dumps
from ckptfs.model.records import Tensor

_FIELDS = attrgetter("dtype.name", "shape", "stride", "storage_offset", "requires_grad", "is_parameter", "kind",
                     "conj", "neg", "type_name")
"""What a sidecar holds of the tensor itself (the rest follows from these: ``describe.tensor_metadata``)."""
_CHUNK_FIELDS = attrgetter("offsets", "sizes", "file", "transforms")
CHUNK_FAMILY = object()
"""First in a family tuple of these tensors, which no other family starts with."""
_Varying = Callable[[Tensor], tuple[str, str, str, str]]


def chunk_family(tensor: Tensor) -> tuple[Any, ...] | None:
    """The tensor's family when it is one chunk in a file (not a shard of a ShardedTensor), with no storage and
    not quantized; else None (rendered whole)."""
    chunks = tensor.chunks
    if chunks is None or len(chunks) != 1 or not chunks[0].file or tensor.quantization is not None:
        return None
    return (CHUNK_FAMILY, *_FIELDS(tensor), *_CHUNK_FIELDS(chunks[0]))


def chunk_template(tensor: Tensor, path: str, written_text: Callable[[str], str]
                   ) -> tuple[str, _Varying, Callable[[list[Tensor]], list[int]]]:
    """The family's ``str.format`` text (field 0: the key path, whose marker in the JSON text is ``path``;
    1 and 2: the range; 3 and 4: the source range's bounds), what fills fields 1–4, and their lengths in bulk."""
    meta = tensor_metadata(tensor, path=path)
    file = tensor.chunks[0].file  # type: ignore[index]
    meta["chunks"][0]["range"] = [_marker(1), _marker(2)]
    meta["source_ranges"] = [[file, _marker(3), _marker(4)]]
    text = written_text(dumps(meta)).replace("{", "{{").replace("}", "}}").replace(dumps(path), "{0}", 1) + "\n"
    for field in range(1, 5):
        text = text.replace(dumps(_marker(field)), f"{{{field}}}", 1)

    def varying(t: Tensor) -> tuple[str, str, str, str]:
        chunk = t.chunks[0]  # type: ignore[index]
        start, end = int.__repr__(chunk.start), int.__repr__(chunk.start + chunk.length)
        return start, end, start, end

    def lengths(tensors: list[Tensor]) -> list[int]:
        chunks = [t.chunks[0] for t in tensors]  # type: ignore[index]
        starts, ends = [c.start for c in chunks], [c.start + c.length for c in chunks]
        return [2 * n for n in decimal_lengths([(starts, 0), (ends, 0)])]  # each written twice

    return text, varying, lengths


def _marker(field: int) -> str:
    return f"\x00ckptfs:chunk:{field}\x00"
