"""A progress line on a terminal while a command parses a checkpoint (parsing 200,000 tensors takes seconds).

A daemon thread looks at the main thread's stack every ``INTERVAL`` seconds
and rewrites one line of stderr in place (``\\r``): the pickle interpreter's
position while it runs, else the phase under way. The parser neither reports
nor checks anything, so its loop costs the same with and without a terminal;
the thread is only started when stderr is one. Nothing is shown for the first
``DELAY`` seconds; after them, the first look that finds the main thread in
no known phase (a mount serving) or writing the output clears the line and
ends the thread, as does the end of the command.
Writes are ``os.write`` calls: no Python buffer's lock is ever held by the
thread, so a fork (the mount's daemon) never inherits one taken.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from types import CodeType, FrameType, TracebackType
from typing import Callable

from ckptfs.counts import counted

INTERVAL = 0.2
DELAY = 0.5
"""Commands that end sooner show nothing."""

Describe = Callable[[FrameType], str]


def mebibytes(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.1f} MiB"


def _pickle(frame: FrameType) -> str:
    unpickler = frame.f_locals["self"]
    total = len(unpickler.data)
    done = min(unpickler.pos, total)
    return f"reading the pickle: {100 * done // max(total, 1)}% ({mebibytes(done)} of {mebibytes(total)})"


def _tensors(frame: FrameType) -> str:
    return f"walking the object tree: {counted(len(frame.f_locals['self'].tensors), 'tensor')}"


def _phases() -> dict[CodeType, Describe]:
    """What each known function is doing, innermost first when they nest."""
    from ckptfs.cache import MetadataCache
    from ckptfs.checkpoint import Checkpoint, open_checkpoint
    from ckptfs.cli.compare import Comparison
    from ckptfs.cli.convert import archive_status, cmd_convert, copy_status, write_npz, write_pieces
    from ckptfs.cli.diff import cmd_diff
    from ckptfs.cli.diff_match import entries, paired
    from ckptfs.cli.info import description_text, indented
    from ckptfs.cli.listing import tensor_files
    from ckptfs.cli.output import write_text
    from ckptfs.formats import zip_columns
    from ckptfs.fs.layout import Layout
    from ckptfs.pickle import cscan
    from ckptfs.pickle.unpickler import SafeUnpickler
    from ckptfs.saving.torch_pickle import TorchPickler
    from ckptfs.saving.torch_save import TorchArchive

    def says(text: str) -> Describe:
        return lambda frame: text

    return {
        SafeUnpickler.load.__code__: _pickle,
        cscan.scan.__code__: says("reading the pickle (compiled scanner)"),
        zip_columns._tree.__code__: says("making the tensor records"),
        Checkpoint._collect_tensors.__code__: _tensors,
        MetadataCache.load.__code__: says("reading the metadata cache"),
        MetadataCache.save.__code__: says("writing the metadata cache"),
        open_checkpoint.__code__: says("opening the checkpoint"),
        Layout.__init__.__code__: says("laying out the tree"),
        tensor_files.__code__: says("naming the files"),
        description_text.__code__: says("making the JSON description"),
        indented.__code__: says("laying out the JSON description"),
        write_pieces.__code__: lambda frame: copy_status(frame.f_locals["copied"]),
        write_npz.__code__: lambda frame: copy_status(frame.f_locals["copied"]),
        TorchPickler.dump.__code__: says("writing the pickle"),
        TorchArchive.write.__code__: lambda frame: archive_status(frame.f_locals["self"]),
        cmd_convert.__code__: says("converting"),
        entries.__code__: says("listing the places to compare"),
        paired.__code__: says("pairing the places"),
        Comparison._compare_all.__code__: lambda frame: frame.f_locals["self"].progress(),
        Comparison.run.__code__: says("sorting out what to compare"),
        cmd_diff.__code__: says("comparing"),
        write_text.__code__: says(""),  # the output may go to the same terminal: the line is cleared for good
    }


class ProgressLine:
    """``with ProgressLine(): ...``: the line on stderr while the block runs, if stderr is a terminal."""

    def __init__(self, fd: int = 2) -> None:
        self.fd = fd
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._shown = 0
        """Characters of the line on screen."""
        self._text = ""

    def __enter__(self) -> ProgressLine:
        if os.isatty(self.fd):
            self._thread = threading.Thread(target=self._run, args=(threading.get_ident(),), daemon=True,
                                            name="ckptfs-progress")
            self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._show("")

    def _run(self, main: int) -> None:
        phases = _phases()
        start = time.monotonic()
        while not self._stop.wait(INTERVAL):
            if time.monotonic() - start >= DELAY:
                status = self._status(main, phases)
                self._show(status)
                if not status:
                    return

    def _status(self, main: int, phases: dict[CodeType, Describe]) -> str:
        frame: FrameType | None = sys._current_frames().get(main)
        while frame is not None:
            describe = phases.get(frame.f_code)
            if describe is not None:
                text = describe(frame)
                return "ckptfs: " + text if text else ""
            frame = frame.f_back
        return ""

    def _show(self, text: str) -> None:
        try:
            width = os.get_terminal_size(self.fd).columns or 80  # 0: a terminal that never said
        except OSError:
            width = 80
        text = text[: width - 1]  # a line that wraps could not be rewritten in place
        if text == self._text:
            return
        self._text = text
        line = "\r" + text + " " * max(0, self._shown - len(text)) + ("\r" if not text else "")
        self._shown = len(text)
        with contextlib.suppress(OSError):
            os.write(self.fd, line.encode("utf-8", "replace"))

