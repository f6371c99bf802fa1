"""Views: the files shown beside each tensor, one row of ``views`` each (today the ``NAME.json`` sidecar).

A view has a name suffix (reserved: no key's name ends with it), a slot in the
tensor's block of inode numbers, and makes its files' sizes (in bulk: a listing
needs every one) and contents (as pieces). A new view is a class here and a row
in ``views``.
"""

from __future__ import annotations

from typing import Protocol, Sequence

from ckptfs.fs.pathtext import PathTexts
from ckptfs.fs.pieces import Literal, Piece
from ckptfs.fs.sidecar import SidecarMaker
from ckptfs.model.records import Tensor

SIDECAR_SUFFIX = ".json"


class View(Protocol):
    suffix: str
    slot: int
    """The file's inode number is the tensor entry's plus this (1 … ``SLOTS`` − 1)."""

    def sizes(self, tensors: Sequence[Tensor]) -> list[int]: ...

    def pieces(self, tensor: Tensor) -> list[Piece]: ...


class SidecarView:
    """``NAME.json``: the tensor's metadata (``fs.describe.tensor_metadata``) as JSON and a newline."""

    suffix = SIDECAR_SUFFIX
    slot = 1

    def __init__(self, paths: PathTexts) -> None:
        self.maker = SidecarMaker(paths)

    def sizes(self, tensors: Sequence[Tensor]) -> list[int]:
        return self.maker.sizes(tensors)

    def pieces(self, tensor: Tensor) -> list[Piece]:
        return [Literal(self.maker(tensor))]


def views(paths: PathTexts) -> tuple[View, ...]:
    """The views of one layout, in listing order after each tensor."""
    return (SidecarView(paths),)
