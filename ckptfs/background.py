"""Processes that outlive the command that starts them: the mount's daemon, and the writer of a metadata cache
entry that neither a mount nor a listing waits for."""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import Callable


def fork() -> int:
    """``os.fork``, without the warning numpy's idle BLAS threads set off on Python 3.12+ (the child never uses
    them)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return os.fork()


def detach() -> None:
    """In a forked child: a session of its own and a second fork, so that no terminal signals it and the caller's
    ``waitpid`` on the child returns at once. Returns in the grandchild; the child exits."""
    os.setsid()
    if fork() != 0:
        os._exit(0)


def run_in_background(task: Callable[[], None]) -> None:
    """Runs ``task`` in a detached, niced process with its standard streams on /dev/null (a pipe the caller writes
    to closes when the caller exits, not when ``task`` ends) and returns at once. ``task``'s errors are its own:
    the caller learns nothing of them; where the system makes no new process (EAGAIN, ENOMEM), ``task`` is not run.
    """
    try:
        pid = fork()
    except OSError:
        return
    if pid == 0:
        try:
            detach()
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.nice(19)
            task()
        finally:
            os._exit(0)
    with contextlib.suppress(ChildProcessError):  # SIGCHLD ignored: the child was reaped already
        os.waitpid(pid, 0)
