"""Ctrl-C in the ``ckptfs`` command: ``ckptfs: interrupted`` and status 130, never a traceback.

Until a command runs (the interpreter importing ckptfs, parsing the arguments,
flushing the output at the end) SIGINT ends the process at once: a
``KeyboardInterrupt`` raised inside an import would escape everything. While
the command runs (``RaisingInterrupts``), SIGINT raises ``KeyboardInterrupt``
as usual, so that ``finally`` blocks remove partial outputs before ``main``
prints the line, until the command's output is complete (``ignore_interrupts``). This module runs before Ctrl-C is caught, so it imports as
little as it can (not even ``typing``).
"""

from __future__ import annotations

import os
import signal

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType, TracebackType
    from typing import Any

INTERRUPTED = 130
"""Exit status after Ctrl-C, as shells report a command killed by SIGINT."""


def _exit_now(signum: int, frame: FrameType | None) -> None:
    try:
        os.write(2, b"ckptfs: interrupted\n")
    finally:
        os._exit(INTERRUPTED)


def exit_on_interrupt() -> None:
    """From now on Ctrl-C ends the process with the one line (first thing in an entry point)."""
    signal.signal(signal.SIGINT, _exit_now)


def ignore_interrupts() -> None:
    """From now on Ctrl-C is ignored: the command's output is complete and being put in place, so the command
    ends as done (status 0, the output kept), never as interrupted with its output left behind."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class RaisingInterrupts:
    """Within the block Ctrl-C raises ``KeyboardInterrupt``; the handler before it is back after (outside the
    main thread, where no handler can be set, nothing changes)."""

    def __init__(self) -> None:
        self._before: Any = None

    def __enter__(self) -> None:
        try:
            self._before = signal.signal(signal.SIGINT, signal.default_int_handler)
        except ValueError:
            self._before = None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self._before is not None and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            signal.signal(signal.SIGINT, self._before)
