"""Tensor sidecars: ``json.dumps(tensor_metadata(t))`` plus a newline, made fast for many alike tensors.

``find -ls`` and every directory listing need each sidecar's size, so a
20,000-tensor checkpoint needs 20,000 sidecars at once. Tensors that differ only
in where they are — path, storage key and record, offsets in the source —
share the rest of their metadata; that rest is rendered once per family, with
markers where the per-tensor values go, and each sidecar is the template with
the markers filled in. Uncommon tensors (quantized, without data, held in the
pickle) are rendered whole. The output is byte-for-byte what
``json.dumps(tensor_metadata(t))`` gives (tests compare them).
"""

from __future__ import annotations

from typing import Any, Callable

from ckptfs.describe import encode_key, source_ranges, tensor_metadata
from ckptfs.jsontext import dumps
from ckptfs.model import Tensor

_Getter = Callable[[Tensor], Any]
_VARYING: dict[str, _Getter] = {
    "path": lambda t: [encode_key(k) for k in t.path],
    "key": lambda t: t.storage.key,  # type: ignore[union-attr]
    "record": lambda t: t.storage.record,  # type: ignore[union-attr]
    "offset": lambda t: t.storage.offset,  # type: ignore[union-attr]
    "source_ranges": source_ranges,
}
"""The per-tensor values of a sidecar, by marker name."""


def _marker(name: str) -> str:
    return f"\x00ckptfs:{name}\x00"


def _family(tensor: Tensor) -> tuple[Any, ...] | None:
    """What a sidecar holds besides the ``_VARYING`` values; None for tensors rendered whole."""
    storage = tensor.storage
    if storage is None or tensor.quantization is not None or storage.inline_data is not None:
        return None
    return (tensor.dtype.name, tensor.shape, tensor.stride, tensor.storage_offset, tensor.requires_grad,
            tensor.is_parameter, tensor.kind, tensor.conj, tensor.neg, tensor.type_name,
            storage.dtype.name, storage.location, storage.numel, storage.byteorder, storage.compressed)


class SidecarMaker:
    """Sidecar bytes of tensors, one template per family (see the module docstring)."""

    def __init__(self) -> None:
        self._templates: dict[tuple[Any, ...], tuple[str, list[_Getter]]] = {}

    def __call__(self, tensor: Tensor) -> bytes:
        family = _family(tensor)
        if family is None:
            return (dumps(tensor_metadata(tensor)) + "\n").encode("ascii")
        template = self._templates.get(family)
        if template is None:
            template = self._templates[family] = _template(tensor)
        text, getters = template
        return text.format(*[dumps(get(tensor)) for get in getters]).encode("ascii")


def _template(tensor: Tensor) -> tuple[str, list[_Getter]]:
    """The tensor's sidecar as a ``str.format`` template, and what fills its fields, in order."""
    meta = tensor_metadata(tensor)
    meta["path"] = _marker("path")
    meta["source_ranges"] = _marker("source_ranges")
    for name in ("key", "record", "offset"):
        meta["storage"][name] = _marker(name)
    text = dumps(meta).replace("{", "{{").replace("}", "}}") + "\n"
    placed = sorted((text.index(dumps(_marker(name))), name) for name in _VARYING)
    for _, name in placed:
        text = text.replace(dumps(_marker(name)), "{}")
    return text, [_VARYING[name] for _, name in placed]
