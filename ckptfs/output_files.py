"""Output files that appear whole or not at all: written beside their name, fsynced, renamed (``cat -o``,
``convert``); an ``OSError`` while writing becomes one ``OutputError`` line naming the output."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from ckptfs.errors import CkptfsError, OutputError

PARTIAL_SUFFIX = ".ckptfs-partial"


@contextlib.contextmanager
def partial_file(out: Path, committing: Callable[[], None] | None = None) -> Iterator[BinaryIO]:
    """A file to write ``out``'s bytes to, fsynced and renamed to ``out`` when the block ends without an error.
    ``committing`` runs once the bytes are on disk, before the rename (the command line stops taking Ctrl-C there:
    the output is then complete, and stays)."""
    partial = out.with_name(out.name + PARTIAL_SUFFIX)
    try:
        with writing(out), open(partial, "wb") as stream:
            yield stream
            stream.flush()
            os.fsync(stream.fileno())
        if committing is not None:
            committing()
        os.replace(partial, out)
        _sync_directory(out.parent)
    except BaseException:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise


def _sync_directory(directory: Path) -> None:
    """The rename on disk too (a file system that cannot sync a directory has nothing to sync)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def writing(out: Path) -> Iterator[None]:
    """An ``OSError`` while writing becomes an ``OutputError`` naming the output (disk full …)."""
    try:
        yield
    except CkptfsError:
        raise
    except OSError as exc:
        raise OutputError(f"{out}: {exc.strerror or exc}") from None
