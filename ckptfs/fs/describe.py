"""JSON descriptions of tensors and of the object tree (the CLI's ``info`` and the mount's metadata).

Values JSON cannot hold are encoded as one-key objects whose key starts with
``$`` (documented in docs/formats.md, "JSON encodings"): ``$bytes`` (base64), ``$int`` (decimal text,
for integers beyond ±2**53), ``$float`` (``nan``, ``inf``, ``-inf``),
``$complex``, ``$tuple``, ``$set``, ``$dict`` (pairs, for non-string keys),
``$global``, ``$object``, ``$ndarray``, ``$tensor``, ``$ref`` (a value met
before, by its path) and ``$repr`` (a bounded repr: an object used as a key).
"""

from __future__ import annotations

import json
import sys
from typing import Any, Callable, TypeVar

from ckptfs.errors import LimitExceededError
from ckptfs.fs.npy import npy_dtype
from ckptfs.model.encoding import encode_key, encode_leaf, has_surrogates
from ckptfs.model.jsontext import dumps, scalar_text
from ckptfs.model.records import Chunk, NestedTensor, SparseTensor, Storage, Tensor, Trail
from ckptfs.model.trails import key_lists
from ckptfs.model.tree import children, is_container
from ckptfs.pickle.values import PickledObject
from ckptfs.reading.extents import source_ranges

RECURSION_LIMIT = 20_000
"""Enough for trees as deep as ``max_tree_depth``'s default allows, many times over."""


def _npy_field(tensor: Tensor) -> dict[str, str] | None:
    """What the tensor's ``NAME.npy`` holds (``fs.npy``): its numpy dtype, and the true dtype when those are raw
    bits; None when there is no ``.npy``."""
    found = npy_dtype(tensor)
    if found is None:
        return None
    descr, raw = found
    return {"descr": descr, "raw_bits_of": tensor.dtype.name} if raw else {"descr": descr}


def tensor_metadata(tensor: Tensor, path: Any = None) -> dict[str, Any]:
    """Everything a reader of the tensor's bytes needs to know, as JSON-ready values.

    ``path`` stands in for the encoded key path (sidecars put in text they made already).
    """
    meta: dict[str, Any] = {
        "path": [encode_key(k) for k in tensor.path] if path is None else path,
        "dtype": tensor.dtype.name,
        "numpy_dtype": tensor.numpy_dtype,
        "shape": list(tensor.shape),
        "stride": list(tensor.stride),
        "storage_offset": tensor.storage_offset,
        "itemsize": tensor.itemsize,
        "numel": tensor.numel,
        "nbytes": tensor.nbytes,
        "is_contiguous": tensor.is_contiguous,
        "byteorder": "little",
        "source_byteorder": tensor.byteorder,
        "requires_grad": tensor.requires_grad,
        "is_parameter": tensor.is_parameter,
        "kind": tensor.kind,
        "has_data": tensor.has_data,
        "npy": _npy_field(tensor),
    }
    if tensor.conj or tensor.neg:
        meta["conj"], meta["neg"] = tensor.conj, tensor.neg
    if tensor.type_name:
        meta["type"] = tensor.type_name
    if tensor.quantization is not None:
        q = tensor.quantization
        meta["quantization"] = {
            "scheme": q.scheme,
            "scale": q.scale,
            "zero_point": q.zero_point,
            "axis": q.axis,
            "scales": _tensor_ref(q.scales),
            "zero_points": _tensor_ref(q.zero_points),
        }
    storage = tensor.storage
    if storage is not None:
        meta["storage"] = {
            "key": storage.key,
            "location": storage.location,
            "record": storage.record,
            "dtype": storage.dtype.name,
            "nbytes": storage.nbytes,
            "offset": storage.offset if storage.inline_data is None else None,
            "compressed": storage.compressed,
            "written": storage.written,
        }
        meta["source_ranges"] = source_ranges(tensor)
    if tensor.chunks is not None:
        meta["chunks"] = [_chunk_metadata(chunk) for chunk in tensor.chunks]
        meta["source_ranges"] = source_ranges(tensor)
    return meta


def _chunk_metadata(chunk: Chunk) -> dict[str, Any]:
    """A chunk of a chunked tensor: its box in the tensor, and the torch.save archive in a file holding it, or
    (a ShardedTensor's shard) the path of the shard's tensor."""
    meta: dict[str, Any] = {"offsets": list(chunk.offsets), "sizes": list(chunk.sizes)}
    if not chunk.file and chunk.tensor is not None:
        meta["tensor"] = [encode_key(k) for k in chunk.tensor.path]
        return meta
    meta.update(file=chunk.file, range=[chunk.start, chunk.start + chunk.length])
    if chunk.transforms:
        meta["transforms"] = list(chunk.transforms)
    return meta


def storage_metadata(storage: Storage) -> dict[str, Any]:
    """Where one storage's bytes are in the source: what a pass filling a ``skip_data`` file needs."""
    return {
        "key": storage.key,
        "record": storage.record,
        "dtype": storage.dtype.name,
        "location": storage.location,
        "numel": storage.numel,
        "nbytes": storage.nbytes,
        "offset": storage.offset if storage.inline_data is None else None,
        "compressed": storage.compressed,
        "written": storage.written,
        "view_of": storage.base.key if storage.base is not None else None,
    }


def _tensor_ref(tensor: Tensor | None) -> dict[str, Any] | None:
    if tensor is None:
        return None
    return {"$tensor": {k: v for k, v in tensor_metadata(tensor).items() if k != "path"}}


class TextBudget:
    """How much JSON text a description may still come to; LimitExceededError past ``max_bytes``.

    A small file can describe a huge text (a long string referenced a million
    times), so sizes are counted while the JSON-ready values are made, before
    any text is.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.left = max_bytes

    def spend(self, size: int) -> None:
        self.left -= size
        if self.left < 0:
            raise LimitExceededError(f"the JSON description would exceed {self.max_bytes} bytes "
                                     "(limit max_generated_bytes)")

    def charged(self, value: Any) -> Any:
        """``value`` (JSON-ready and small), its text's length spent."""
        self.spend(len(scalar_text(value)))
        return value


def encode_tree(root: Any, budget: TextBudget | None = None,
                tensor_value: Callable[[Tensor], Any] | None = None) -> Any:
    """The whole object tree as JSON-ready values; tensors become ``$tensor`` metadata.

    ``tensor_value``: what stands for a tensor's metadata instead (its text counted by the caller).
    """
    return _deep(_Encoder(budget or TextBudget(sys.maxsize), tensor_value).encode, root, None)


def json_text(value: Any) -> str:
    """Compact JSON text of JSON-ready values, however deeply they nest (within the tree limits)."""
    return _deep(json.dumps, value)


_T = TypeVar("_T")


def _deep(function: Callable[..., _T], *args: Any) -> _T:
    """``function(*args)`` with room for recursion as deep as the tree; deeper fails as a limit."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, RECURSION_LIMIT))
    try:
        return function(*args)
    except RecursionError:
        # Only when max_tree_depth was raised far past its default: fail cleanly rather than crash.
        raise LimitExceededError(f"object tree too deep to describe as JSON (max_tree_depth above about "
                                 f"{RECURSION_LIMIT // 4} is not supported)") from None
    finally:
        sys.setrecursionlimit(limit)


class _Place(list):  # type: ignore[type-arg]
    """A ``$ref`` path, with the length of its text."""

    size = 0


class _Encoder:
    """``encode_tree``'s walk: objects met before become ``$ref``s, every text counted in ``budget``."""

    def __init__(self, budget: TextBudget, tensor_value: Callable[[Tensor], Any] | None) -> None:
        self.budget = budget
        self.tensor_value = tensor_value
        self.seen: dict[int, Any] = {}
        """Each object met: its trail, then, once referenced again, its ``_Place``."""
        self.keys = key_lists(encode_key)

    def encode(self, value: Any, trail: Trail) -> Any:
        budget = self.budget
        if isinstance(value, Tensor) or is_container(value):
            if id(value) in self.seen:
                place = self.seen[id(value)]
                if not isinstance(place, _Place):  # a trail: encode its path once, for every later reference
                    place = self.seen[id(value)] = _Place(self.keys.value(place))
                    place.size = len(dumps(place)) + len('{"$ref": }')
                budget.spend(place.size)
                return {"$ref": place}
            self.seen[id(value)] = trail
        if isinstance(value, Tensor):
            if self.tensor_value is not None:
                return {"$tensor": self.tensor_value(value)}
            return {"$tensor": budget.charged(tensor_metadata(value, path=list(self.keys.leaf(trail))))}
        if not is_container(value):
            return budget.charged(encode_leaf(value))
        pairs = children(value)
        budget.spend(len(pairs) * 4 + 16)  # brackets, separators, the $ wrapping
        items = [(budget.charged(encode_key(k)) if not isinstance(value, (list, tuple)) else k,
                  self.encode(v, (k, trail))) for k, v in pairs]
        if isinstance(value, list):
            return [v for _, v in items]
        if isinstance(value, tuple):
            return {"$tuple": [v for _, v in items]}
        if isinstance(value, dict):
            if all(isinstance(k, str) and not k.startswith("$") and not has_surrogates(k) for k, _ in items):
                return dict(items)
            return {"$dict": [[k, v] for k, v in items]}
        if isinstance(value, SparseTensor):
            return {"$sparse": {"layout": value.layout, "size": list(value.size), "is_coalesced": value.is_coalesced,
                                "components": dict(items)}}
        if isinstance(value, NestedTensor):
            return {"$nested": dict(items)}
        assert isinstance(value, PickledObject)
        return {"$object": {"class": value.class_name, "children": [[k, v] for k, v in items]}}


