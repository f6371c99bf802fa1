"""Why a checkpoint is not cached, or a cache entry not used: neither ever reaches the user."""

from __future__ import annotations

from ckptfs.errors import CkptfsError


class NotCacheable(CkptfsError):
    """The checkpoint holds something a cache entry does not describe; it is parsed each time."""


class BadEntry(CkptfsError):
    """A cache entry that is truncated, corrupt, of another version or key, or describes an impossible
    checkpoint: it is discarded and the checkpoint parsed."""
