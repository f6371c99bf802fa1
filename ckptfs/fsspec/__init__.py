"""An fsspec file system showing a checkpoint as its mount does, under the protocol ``ckpt``.

Needs fsspec (``pip install ckptfs[fsspec]``); fsspec finds it through the
``fsspec.specs`` entry point. See ``filesystem`` for what it shows.
"""

from __future__ import annotations

from ckptfs.fsspec.filesystem import CheckpointFileSystem

__all__ = ["CheckpointFileSystem"]
