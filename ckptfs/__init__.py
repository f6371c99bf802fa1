"""ckptfs: read PyTorch checkpoints lazily and safely, without torch, and mount them as files.

The names below are imported on first use, so that ``import ckptfs.cli`` (the
``ckptfs`` command) can catch Ctrl-C before the parsing layers are loaded.
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # not typing's: importing typing takes longer than the rest of this module
if TYPE_CHECKING:
    from typing import Any

    from ckptfs.checkpoint import Checkpoint
    from ckptfs.checkpoint import open_checkpoint as open
    from ckptfs.errors import (
        CkptfsError,
        CorruptCheckpointError,
        LimitExceededError,
        NotACheckpointError,
        SourceError,
        UnpicklingError,
        UnsupportedError,
    )
    from ckptfs.limits import Limits
    from ckptfs.model.dtypes import DType
    from ckptfs.model.records import NestedTensor, SparseTensor, Storage, Tensor
    from ckptfs.saving import save_torch

_HOMES = {
    "Checkpoint": ("ckptfs.checkpoint", "Checkpoint"),
    "open": ("ckptfs.checkpoint", "open_checkpoint"),
    **{name: ("ckptfs.errors", name) for name in (
        "CkptfsError", "CorruptCheckpointError", "LimitExceededError", "NotACheckpointError", "SourceError",
        "UnpicklingError", "UnsupportedError")},
    "Limits": ("ckptfs.limits", "Limits"),
    "DType": ("ckptfs.model.dtypes", "DType"),
    **{name: ("ckptfs.model.records", name) for name in ("NestedTensor", "SparseTensor", "Storage", "Tensor")},
    "save_torch": ("ckptfs.saving", "save_torch"),  # the writer brings the fs layer, which reading programs skip
}

__all__ = [
    "Checkpoint",
    "CkptfsError",
    "CorruptCheckpointError",
    "DType",
    "LimitExceededError",
    "Limits",
    "NestedTensor",
    "NotACheckpointError",
    "SourceError",
    "SparseTensor",
    "Storage",
    "Tensor",
    "UnpicklingError",
    "UnsupportedError",
    "open",
    "save_torch",
]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'ckptfs' has no attribute {name!r}")
    module, attribute = _HOMES[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
