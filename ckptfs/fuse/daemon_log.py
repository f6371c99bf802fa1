"""Where a mount's daemon writes its warnings and errors (an EIO read of a truncated source, a size it cannot compute).

Until the mount is ready they go to stderr, which for a background mount is
a pipe to the calling command: whatever stops the daemon becomes its one-line
error. From the moment the caller is told the mount is ready, a background
daemon writes them to ``--log-file`` (appended, one timestamped line each),
else to syslog when ``/dev/log`` exists, else nowhere. A foreground mount
writes them on stderr, or from the start to ``--log-file`` if given.
libfuse's own messages, and ``--debug``'s line per request, go to stderr: once
the mount is ready, the log file if there is one, else (in the background)
nowhere.
"""

from __future__ import annotations

import logging
import os
import stat
import sys

from ckptfs.errors import MountError

SYSLOG = "/dev/log"
STDERR_FORMAT = "ckptfs: %(message)s"
FILE_FORMAT = "%(asctime)s ckptfs[%(process)d]: %(levelname)s: %(message)s"
DATE_FORMAT = "%Y-%m-%dT%H:%M:%S%z"


def open_log_file(path: str | None) -> int | None:
    """The log file opened for appending (created 0644 if missing); MountError naming it if that fails."""
    if path is None:
        return None
    try:
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise MountError(f"cannot open the log file: {exc.strerror}", os.path.abspath(path)) from None


def log_to_stderr(debug: bool) -> None:
    _install(logging.StreamHandler(sys.stderr), STDERR_FORMAT, debug)


def log_to_file(fd: int, debug: bool) -> None:
    """Every log record from now on is appended to ``fd`` (through a descriptor of its own: stderr stays)."""
    stream = os.fdopen(os.dup(fd), "a", buffering=1, encoding="utf-8", errors="backslashreplace")
    _install(logging.StreamHandler(stream), FILE_FORMAT, debug)


def redirect_stderr(fd: int) -> None:
    """From now on stderr (libfuse's messages, ``--debug``'s request lines, tracebacks) goes to ``fd``."""
    sys.stderr.flush()
    os.dup2(fd, 2)


def log_nowhere() -> None:
    _install(logging.NullHandler(), "", False)


def log_to_syslog(debug: bool, address: str = SYSLOG) -> bool:
    """Log records go to syslog (facility user, tag ``ckptfs[PID]``); False, changing nothing, if it is not there."""
    try:
        if not stat.S_ISSOCK(os.stat(address).st_mode):
            return False
    except OSError:
        return False
    import logging.handlers  # here: it imports socket, pickle and queue, which a mount's start does without

    handler = logging.handlers.SysLogHandler(address)  # never raises: it reconnects when it logs
    handler.ident = f"ckptfs[{os.getpid()}]: "
    _install(handler, "%(levelname)s: %(message)s", debug)
    return True


def _install(handler: logging.Handler, fmt: str, debug: bool) -> None:
    """Makes ``handler`` the only one, in one step: a record logged meanwhile by another thread is not lost."""
    root = logging.getLogger()
    handler.setFormatter(logging.Formatter(fmt, DATE_FORMAT))
    root.setLevel(logging.DEBUG if debug else logging.WARNING)
    old, root.handlers = root.handlers, [handler]
    for replaced in old:
        replaced.close()
    # mfusepy logs a line per callback it installs: set-up noise, not what the daemon does.
    logging.getLogger("fuse").setLevel(logging.WARNING)
