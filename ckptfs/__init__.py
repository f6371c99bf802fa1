"""ckptfs: read PyTorch checkpoints lazily and safely, without torch, and mount them as files."""

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
]
