"""Tensor sidecars: ``json.dumps(tensor_metadata(t))`` plus a newline, made fast for many alike tensors.

``find -ls`` and every directory listing need each sidecar's size, so a
20,000-tensor checkpoint needs 20,000 sidecars at once. Tensors that differ only
in where they are — path, storage key and record, offsets in the source —
share the rest of their metadata; that rest is rendered once per family, with
markers where the per-tensor values go, and each sidecar is the template with
the markers filled in. Uncommon tensors (quantized, without data, held in the
pickle) are rendered whole. The key path's text comes from ``PathTexts``
(cached per parent, bounded by ``max_generated_bytes``). The output is
byte-for-byte what ``json.dumps(tensor_metadata(t))`` gives (tests compare them),
but for one space in a writable mount's (``steady_written``): there a storage's
``written`` turns true once its bytes are written, while its sidecar stays the
size it was listed with, so ``true`` is written ``" true"``, as wide as ``false``.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Callable, Iterable, Iterator

from ckptfs.fs.chunk_sidecar import chunk_family, chunk_template
from ckptfs.fs.describe import tensor_metadata
from ckptfs.fs.pathtext import PathTexts
from ckptfs.limits import Limits
from ckptfs.model.jsontext import decimal_lengths, dumps, plain_lengths, quote
from ckptfs.model.records import Storage, Tensor
from ckptfs.reading.extents import source_ranges

_STORAGE_FIELDS = ("key", "record", "offset")
_VARYING = (*_STORAGE_FIELDS, "source_ranges")
"""The per-tensor values of a sidecar besides its path: its storage's key, record and offset, and its
``source_ranges``; in this order, the texts ``_Template.varying`` gives (``str.format`` fields 1–4)."""
_BULK = 64
"""Fewer tensors than this have their sidecars' sizes made one by one: a bulk pass's fixed cost is more."""
_Varying = Callable[[Tensor], tuple[str, str, str, str]]
_Lengths = Callable[[list[Tensor]], list[int]]
"""The lengths of the ``_VARYING`` texts of tensors of one family, summed per tensor."""


def _marker(name: str) -> str:
    return f"\x00ckptfs:{name}\x00"


_PATH = _marker("path")


_FAMILY_FIELDS = attrgetter(
    "dtype.name", "shape", "stride", "storage_offset", "requires_grad", "is_parameter", "kind", "conj", "neg",
    "type_name", "storage.dtype.name", "storage.location", "storage.numel", "storage.byteorder", "storage.compressed",
    "storage.written")


_STORAGE, _QUANTIZATION, _INLINE = attrgetter("storage"), attrgetter("quantization"), attrgetter("inline_data")
_TRAIL = attrgetter("trail")


def _family(tensor: Tensor) -> tuple[Any, ...] | None:
    """What a sidecar holds besides the ``_VARYING`` values; None for tensors rendered whole."""
    storage = tensor.storage
    if storage is None:
        return chunk_family(tensor)
    if tensor.quantization is not None or storage.inline_data is not None:
        return None
    return _FAMILY_FIELDS(tensor)  # type: ignore[no-any-return]


def _families(tensors: list[Tensor]) -> Iterator[tuple[Any, ...] | None]:
    """``map(_family, tensors)``, the checks made a field at a time over them all when none is rendered whole."""
    storages = list(map(_STORAGE, tensors))
    if (None not in storages and list(map(_QUANTIZATION, tensors)).count(None) == len(tensors)
            and list(map(_INLINE, storages)).count(None) == len(storages)):
        return map(_FAMILY_FIELDS, tensors)
    return map(_family, tensors)


@dataclass
class _Template:
    text: str
    """``str.format`` text: field 0 is the key path, fields 1–4 the ``_VARYING`` values."""
    varying: _Varying
    lengths: _Lengths
    fixed: int
    """Length of the text with every field empty."""


class SidecarMaker:
    """Sidecar bytes of tensors, one template per family (see the module docstring)."""

    def __init__(self, paths: PathTexts | None = None, steady_written: bool = False) -> None:
        self._paths = paths or PathTexts(Limits().max_generated_bytes)
        self._templates: dict[tuple[Any, ...], _Template] = {}
        self._steady = steady_written

    def __call__(self, tensor: Tensor) -> bytes:
        path = self._paths.path_text(tensor.trail)
        template = self._template(tensor)
        if template is None:
            text = self._written_text(dumps(_with_path_marker(tensor))).replace(dumps(_PATH), path, 1)
            return (text + "\n").encode("ascii")
        return template.text.format(path, *template.varying(tensor)).encode("ascii")

    def size(self, tensor: Tensor) -> int:
        """``len(self(tensor))``, without making the text."""
        return self.sizes((tensor,))[0]

    def sizes(self, tensors: Iterable[Tensor]) -> list[int]:
        """``[len(self(t)) for t in tensors]``, without making the texts: a listing needs every sidecar's."""
        tensors = list(tensors)
        path_text = self._paths.path_text
        if len(tensors) < _BULK:
            templates = [self._template(tensor) for tensor in tensors]
            return [len(self(t)) if p is None else p.fixed + len(path_text(t.trail)) + len("".join(p.varying(t)))
                    for t, p in zip(tensors, templates)]
        sizes = self._paths.lengths(list(map(_TRAIL, tensors)))  # siblings' in one pass
        families: dict[tuple[Any, ...], list[int]] = {}
        for index, family in enumerate(_families(tensors)):
            if family is None:
                sizes[index] = len(self(tensors[index]))
                continue
            found = families.get(family)
            if found is None:
                found = families[family] = []
            found.append(index)
        for family, indices in families.items():
            members = [tensors[index] for index in indices]
            template = self._template_of(family, members[0])
            fixed = template.fixed
            for index, length in zip(indices, template.lengths(members)):
                sizes[index] += fixed + length
        return sizes

    def _template(self, tensor: Tensor) -> _Template | None:
        family = _family(tensor)
        return None if family is None else self._template_of(family, tensor)

    def _template_of(self, family: tuple[Any, ...], tensor: Tensor) -> _Template:
        template = self._templates.get(family)
        if template is None:
            template = self._templates[family] = _make_template(tensor, self._written_text)
        return template

    def _written_text(self, text: str) -> str:
        return text.replace(_WRITTEN, _STEADY_WRITTEN, 1) if self._steady else text


_WRITTEN = '"written": true'
_STEADY_WRITTEN = '"written":  true'


def _with_path_marker(tensor: Tensor) -> dict[str, Any]:
    return tensor_metadata(tensor, path=_PATH)


def _make_template(tensor: Tensor, written_text: Callable[[str], str]) -> _Template:
    """The tensor's sidecar as a ``str.format`` template, and what fills its fields."""
    if tensor.storage is None:
        text, varying, lengths = chunk_template(tensor, _PATH, written_text)
        return _Template(text, varying, lengths, len(text.format(*[""] * (len(_VARYING) + 1))))
    meta = _with_path_marker(tensor)
    meta["source_ranges"] = _marker("source_ranges")
    for name in _STORAGE_FIELDS:
        meta["storage"][name] = _marker(name)
    text = written_text(dumps(meta)).replace("{", "{{").replace("}", "}}").replace(dumps(_PATH), "{0}", 1) + "\n"
    for field, name in enumerate(_VARYING, 1):
        text = text.replace(dumps(_marker(name)), f"{{{field}}}", 1)
    return _Template(text, *_varying_of_family(tensor), len(text.format(*[""] * (len(_VARYING) + 1))))


def _varying_of_family(tensor: Tensor) -> tuple[_Varying, _Lengths]:
    """The ``_VARYING`` texts of the tensor's family, and their lengths in bulk: whether its source is one range,
    and where in its storage that range is, is the family's."""
    assert tensor.storage is not None
    ranges = source_ranges(tensor)
    one_range = ranges is not None
    delta, nbytes = (ranges[0][0] - tensor.storage.offset, ranges[0][1] - ranges[0][0]) if one_range else (0, 0)

    def varying(t: Tensor) -> tuple[str, str, str, str]:
        storage = t.storage
        offset = storage.offset  # type: ignore[union-attr]
        first = offset + delta
        return (quote(storage.key), quote(storage.record), int.__repr__(offset),  # type: ignore[union-attr]
                f"[[{first}, {first + nbytes}]]" if one_range else "null")

    def lengths(tensors: list[Tensor]) -> list[int]:
        storages: list[Storage] = [t.storage for t in tensors]  # type: ignore[misc]
        offsets = [s.offset for s in storages]
        keys, records = [s.key for s in storages], [s.record for s in storages]
        key_lengths = plain_lengths(keys) or [len(quote(key)) for key in keys]
        record_lengths = plain_lengths(records) or [len(quote(record)) for record in records]
        fixed = len("[[, ]]") if one_range else len("null")
        columns = [(offsets, 0), (offsets, delta), (offsets, delta + nbytes)] if one_range else [(offsets, 0)]
        texts = [fixed + key + record for key, record in zip(key_lengths, record_lengths)]
        return decimal_lengths(columns, texts)

    return varying, lengths

