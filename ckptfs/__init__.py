"""ckptfs: read PyTorch checkpoints lazily and safely, without torch, and mount them as files."""

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
    # ``save_torch`` is imported on first use: most programs only read, and the writer brings the fs layer.
    if name == "save_torch":
        from ckptfs.saving import save_torch

        return save_torch
    raise AttributeError(f"module 'ckptfs' has no attribute {name!r}")
