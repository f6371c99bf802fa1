"""The one exception hierarchy of ckptfs.

Every error raised on bad input is a ``CkptfsError``; its message names the file
and says what is wrong, so the CLI can print it as one line.
"""

from __future__ import annotations


class CkptfsError(Exception):
    """Base of every error ckptfs raises on purpose."""

    def __init__(self, message: str, path: str | None = None) -> None:
        self.path = path
        self.reason = message
        super().__init__(f"{path}: {message}" if path else message)

    def with_path(self, path: str) -> CkptfsError:
        """The same error, naming ``path`` (kept if one is already named)."""
        if self.path is not None:
            return self
        clone = type(self)(self.reason, path)
        clone.__cause__ = self.__cause__ or self
        return clone


class SourceError(CkptfsError):
    """The bytes could not be read: missing file, I/O error, short read."""


class NotACheckpointError(CkptfsError):
    """The file is not in any format ckptfs reads."""


class CorruptCheckpointError(CkptfsError):
    """The file claims a known format but its structure is broken or lies."""


class UnpicklingError(CorruptCheckpointError):
    """The pickle stream is malformed or uses a refused opcode."""


class TruncatedPickleError(UnpicklingError):
    """The pickle stream ends before its STOP opcode."""


class LimitExceededError(CkptfsError):
    """A configurable safety limit (size, depth, count) was exceeded."""


class UnsupportedError(CkptfsError):
    """Valid input that ckptfs does not read (yet), e.g. a compression method."""


class MountError(CkptfsError):
    """A mount or unmount failed: bad mount point, FUSE missing, or the daemon did not come up."""


class OutputError(CkptfsError):
    """A file ckptfs writes (``ckptfs convert``'s output) could not be written: disk full, no permission."""


class ObjectChangedError(SourceError):
    """A remote object was replaced while open: its bytes would mix two versions. Its message ends with
    ``REOPEN``, what a program does; a mount says ``MOUNT_REOPEN`` instead (``for_mount``)."""

    REOPEN = "open it again (ckptfs.open, a new ckpt:// file system) to read the new version"
    MOUNT_REOPEN = "unmount and mount it again"

    def for_mount(self) -> str:
        return str(self).replace(self.REOPEN, self.MOUNT_REOPEN)


class NoSuchObjectError(SourceError):
    """What a path or URL names is not there to read (HTTP 404, or 403 where a store hides what is missing)."""


class NotWritableError(CkptfsError):
    """A write ckptfs refuses: the checkpoint or tensor cannot be written in place (a mount answers EROFS)."""


class WritePastEndError(NotWritableError):
    """A write reaching past the end of a tensor's bytes (a mount answers EFBIG); nothing is written."""
