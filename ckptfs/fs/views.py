"""Views: the files shown beside a tensor, one row of ``views`` each: ``NAME.json`` (every tensor), ``NAME.npy``
(every tensor numpy can hold), and a per-channel quantized tensor's ``NAME.q_scales`` and ``NAME.q_zero_points``.

A view has a name suffix (reserved: no key's name ends with it), a slot in the
tensor's block of inode numbers, says which tensors it is shown beside, and
makes its files' sizes (in bulk: a listing needs every one) and contents (as
pieces). A new view is a class here and a row in ``views``.
"""

from __future__ import annotations

from typing import Callable, Collection, Iterable, Protocol, Sequence

from ckptfs.errors import CkptfsError

from ckptfs.fs.npy import npy_dtype, npy_header
from ckptfs.fs.pathtext import PathTexts
from ckptfs.fs.pieces import Literal, Piece, tensor_pieces
from ckptfs.fs.sidecar import SidecarMaker
from ckptfs.model.records import Tensor
from ckptfs.reading.extents import Extent

SIDECAR_SUFFIX = ".json"
SCALES_SUFFIX = ".q_scales"
ZERO_POINTS_SUFFIX = ".q_zero_points"
NPY_SUFFIX = ".npy"
VIEW_NAMES = ("json", "npy", "q_scales", "q_zero_points", "safetensors", "zarr")
"""What ``-o views=`` names: the per-tensor views by their suffix, each directory's ``model.safetensors`` and
``/.zarr``."""
NPY_HEADERS = 4096
"""``.npy`` headers remembered by dtype and shape (a model has few distinct shapes)."""

Extents = Callable[[Tensor], "list[Extent] | None"]
"""``Checkpoint.extents``: where a tensor's bytes are stored as they are."""


def data_sizes(tensors: Sequence[Tensor]) -> list[int]:
    """The sizes of the tensors' files, ``[t.nbytes if t.has_data else 0 for t in tensors]``: once per dtype, shape
    and kind, as a listing needs them all."""
    known: dict[tuple[str, tuple[int, ...], str], int] = {}
    sizes = []
    for tensor in tensors:
        if tensor.storage is None and tensor.chunks is None:
            sizes.append(0)
            continue
        key = (tensor.dtype.name, tensor.shape, tensor.kind)
        nbytes = known.get(key)
        if nbytes is None:
            nbytes = known[key] = tensor.nbytes
        sizes.append(nbytes)
    return sizes


class View(Protocol):
    suffix: str
    slot: int
    """The file's inode number is the tensor entry's plus this (1 … ``SLOTS`` − 1)."""

    def shows(self, tensor: Tensor) -> bool: ...

    def shown(self, tensors: Sequence[Tensor]) -> list[bool]:
        """``[self.shows(t) for t in tensors]``, for a whole directory at once."""

    def sizes(self, tensors: Sequence[Tensor]) -> list[int]: ...

    def pieces(self, tensor: Tensor) -> list[Piece]: ...


class SidecarView:
    """``NAME.json``: the tensor's metadata (``fs.describe.tensor_metadata``) as JSON and a newline."""

    suffix = SIDECAR_SUFFIX
    slot = 1

    def __init__(self, paths: PathTexts, steady_written: bool) -> None:
        self.maker = SidecarMaker(paths, steady_written)

    def shows(self, tensor: Tensor) -> bool:
        return True

    def shown(self, tensors: Sequence[Tensor]) -> list[bool]:
        return [True] * len(tensors)

    def sizes(self, tensors: Sequence[Tensor]) -> list[int]:
        return self.maker.sizes(tensors)

    def pieces(self, tensor: Tensor) -> list[Piece]:
        return [Literal(self.maker(tensor))]


class NpyView:
    """``NAME.npy``: numpy's header for the tensor (``fs.npy``) followed by the tensor file's bytes."""

    suffix = NPY_SUFFIX
    slot = 2

    def __init__(self, extents: Extents) -> None:
        self._extents = extents
        self._headers: dict[tuple[str, tuple[int, ...]], bytes] = {}

    def shows(self, tensor: Tensor) -> bool:
        return npy_dtype(tensor) is not None

    def shown(self, tensors: Sequence[Tensor]) -> list[bool]:
        known: dict[tuple[str, bool], bool] = {}
        found = []
        for tensor in tensors:
            key = (tensor.dtype.name, tensor.has_data)
            shows = known.get(key)
            if shows is None:
                shows = known[key] = self.shows(tensor)
            found.append(shows)
        return found

    def header(self, tensor: Tensor) -> bytes:
        found = npy_dtype(tensor)
        assert found is not None, "no .npy for this tensor"
        key = (found[0], tensor.shape)
        header = self._headers.get(key)
        if header is None:
            if len(self._headers) >= NPY_HEADERS:
                self._headers.clear()
            header = self._headers[key] = npy_header(*key)
        return header

    def sizes(self, tensors: Sequence[Tensor]) -> list[int]:
        # A .npy is shown beside tensors with data only: its size is its dtype's and shape's.
        known: dict[tuple[str, tuple[int, ...]], int] = {}
        sizes = []
        for tensor in tensors:
            key = (tensor.dtype.name, tensor.shape)
            size = known.get(key)
            if size is None:
                size = known[key] = len(self.header(tensor)) + tensor.nbytes
            sizes.append(size)
        return sizes

    def pieces(self, tensor: Tensor) -> list[Piece]:
        data = tensor_pieces(tensor, self._extents(tensor)) if tensor.nbytes else []
        return [Literal(self.header(tensor)), *data]


class QuantizationTensorView:
    """``NAME.q_scales`` (float64) or ``NAME.q_zero_points`` (int64) of a per-channel quantized tensor: the
    bytes of ``t.q_per_channel_scales()`` or ``t.q_per_channel_zero_points()``, one element per channel."""

    def __init__(self, extents: Extents, suffix: str, slot: int, part: str) -> None:
        self._extents = extents
        self.suffix = suffix
        self.slot = slot
        self.part = part

    def _part(self, tensor: Tensor) -> Tensor | None:
        q = tensor.quantization
        return getattr(q, self.part) if q is not None else None

    def shows(self, tensor: Tensor) -> bool:
        return self._part(tensor) is not None

    def shown(self, tensors: Sequence[Tensor]) -> list[bool]:
        return [tensor.quantization is not None and self.shows(tensor) for tensor in tensors]

    def sizes(self, tensors: Sequence[Tensor]) -> list[int]:
        return [self._tensor(t).nbytes for t in tensors]

    def pieces(self, tensor: Tensor) -> list[Piece]:
        part = self._tensor(tensor)
        return tensor_pieces(part, self._extents(part) if part.nbytes else None)

    def _tensor(self, tensor: Tensor) -> Tensor:
        part = self._part(tensor)
        assert part is not None, "shown only beside per-channel quantized tensors"
        return part


class UnknownViewError(CkptfsError):
    """A view name that is not one of ``VIEW_NAMES``."""


def view_names(names: Iterable[str]) -> frozenset[str]:
    """The names checked (UnknownViewError naming the first unknown one); ``all`` stands for every view."""
    chosen = set()
    for name in names:
        if name == "all":
            chosen.update(VIEW_NAMES)
        elif name not in VIEW_NAMES:
            raise UnknownViewError(f"unknown view {name!r} (views: {', '.join(VIEW_NAMES)}, all)")
        else:
            chosen.add(name)
    return frozenset(chosen)


def views(paths: PathTexts, extents: Extents, shown: Collection[str] = VIEW_NAMES,
          steady_written: bool = False) -> tuple[View, ...]:
    """The per-tensor views of one layout among those ``shown`` names, in listing order after each tensor
    (``steady_written``: of a checkpoint being written, see ``fs.sidecar``)."""
    every: tuple[View, ...] = (
        SidecarView(paths, steady_written), NpyView(extents),
        QuantizationTensorView(extents, SCALES_SUFFIX, 3, "scales"),
        QuantizationTensorView(extents, ZERO_POINTS_SUFFIX, 4, "zero_points"))
    return tuple(view for view in every if view.suffix[1:] in shown)
