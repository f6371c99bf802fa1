"""Big-endian archives made on a little-endian host, byte-identical to what a big-endian host's torch.save writes."""

from __future__ import annotations

import sys
from pathlib import Path

import torch


def _swapped(t: torch.Tensor) -> torch.Tensor:
    """The same tensor with each element's bytes reversed (complex: each half), as a big-endian host holds it."""
    unit = t.element_size() // (2 if t.is_complex() else 1)
    raw = bytearray(bytes(t.untyped_storage()))
    for start in range(0, len(raw), unit):
        raw[start : start + unit] = raw[start : start + unit][::-1]
    flipped = torch.frombuffer(raw, dtype=torch.uint8).view(t.dtype) if raw else torch.empty(0, dtype=t.dtype)
    view = flipped.as_strided(t.shape, t.stride(), t.storage_offset())
    return view.conj() if t.is_conj() else view


def save_big_endian(obj: dict[str, torch.Tensor], path: Path) -> None:
    """``torch.save`` as on a big-endian host: storages in big-endian order, the ``byteorder`` record says so."""
    swapped = {k: _swapped(v) for k, v in obj.items()}
    real = sys.byteorder
    try:
        sys.byteorder = "big"  # type: ignore[misc]  # torch.save reads it at call time
        torch.save(swapped, path)
    finally:
        sys.byteorder = real  # type: ignore[misc]
