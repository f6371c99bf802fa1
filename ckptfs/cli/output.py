"""Writing a command's output: a closed pipe ends it quietly, a failed write (a full disk …) is one error line."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import BinaryIO, Iterable

from ckptfs.cli.interrupts import ignore_interrupts
from ckptfs.errors import CkptfsError
from ckptfs.output_files import partial_file, writing


def discard_output() -> None:
    """After a closed pipe or a failed write: what stdout still buffers goes nowhere, and exiting raises nothing
    more."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def write_text(texts: Iterable[str]) -> None:
    """Writes to stdout; a failure (a full disk …) is a CkptfsError naming it. A closed pipe stays BrokenPipeError."""
    try:
        sys.stdout.writelines(texts)
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        discard_output()
        raise CkptfsError(f"writing the output: {exc.strerror or exc}") from None


def write_binary(chunks: Iterable[bytes], output: str | None) -> None:
    """Writes the chunks to the file ``output``, or to stdout (never a terminal). A failed write is a
    CkptfsError naming it; a closed pipe stays BrokenPipeError (``main`` then ends quietly, as after
    ``ckptfs ls | head``). A file ``output`` appears whole or not at all (``partial_file``)."""
    if output is None:
        if sys.stdout.isatty():
            raise CkptfsError("not writing binary data to a terminal: redirect it, or give -o OUT")
        try:
            _write_all(chunks, sys.stdout.buffer)
        except BrokenPipeError:
            raise
        except OSError as exc:
            discard_output()
            raise CkptfsError(f"writing the output: {exc.strerror or exc}") from None
        return
    path = Path(output)
    if path.exists() and not path.is_file():  # /dev/null, a FIFO ...: never replaced by a file
        with writing(path), open(path, "wb") as out:
            _write_all(chunks, out)
        return
    with partial_file(path, ignore_interrupts) as out:
        _write_all(chunks, out)


def _write_all(chunks: Iterable[bytes], out: BinaryIO) -> None:
    for chunk in chunks:
        out.write(chunk)
    out.flush()
