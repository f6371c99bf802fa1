"""Runs ``ckptfs`` commands in forked children under a time and address-space bound.

Started once (``python runner.py``) with ckptfs already imported, it reads one
JSON request per line — ``{"argv": [...], "timeout": s, "memory": bytes}`` —
forks a child that sets ``RLIMIT_AS`` (unless memory is 0), runs ``ckptfs.cli.main.main(argv)`` exactly
as the console script does (an uncaught exception prints its traceback and
exits 1), and answers one JSON line: exit code, whether it was killed, wall and
CPU time, peak RSS, bytes read and written, stdout and stderr. Forking keeps each case to a few
milliseconds instead of a fresh interpreter's ~250 ms.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

from ckptfs.cli.main import main as cli_main

POLL = 0.002


def _child(argv: list[str], memory: int, out_fd: int, err_fd: int, counts_fd: int) -> None:
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    if memory:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    code = 1
    try:
        code = cli_main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        # The child's own counters, read by itself: once it has exited, /proc/PID/io is root's to read.
        try:
            os.write(counts_fd, Path("/proc/self/io").read_bytes())
        except (OSError, MemoryError):
            pass
        os._exit(code)


def run(argv: list[str], timeout: float, memory: int) -> dict[str, object]:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as counts:
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:
            _child(argv, memory, out.fileno(), err.fileno(), counts.fileno())
        timed_out = False
        while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            if time.monotonic() - start > timeout:
                timed_out = True
                os.kill(pid, signal.SIGKILL)
                os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
                break
            time.sleep(POLL)
        _, status, usage = os.wait4(pid, 0)
        counts.seek(0)
        read, written = _io_counts(counts.read().decode())
        wall = time.monotonic() - start
        out.seek(0)
        err.seek(0)
        return {
            "rc": os.waitstatus_to_exitcode(status),
            "timed_out": timed_out,
            "wall": wall,
            "cpu": usage.ru_utime + usage.ru_stime,
            "maxrss": usage.ru_maxrss * 1024,
            "read": read,
            "written": written,
            "stdout": out.read().decode("utf-8", "replace"),
            "stderr": err.read().decode("utf-8", "replace"),
        }


def _io_counts(text: str) -> tuple[int, int]:
    """Bytes the child read and wrote through system calls (files, pipes; page cache or not): counts of work that
    a busy machine does not change. 0, 0 for a child killed before it could say (a timeout, which fails anyway)."""
    counts = dict(line.split(": ") for line in text.splitlines())
    return int(counts.get("rchar", 0)), int(counts.get("wchar", 0))


def main() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        result = run(request["argv"], request["timeout"], request["memory"])
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
