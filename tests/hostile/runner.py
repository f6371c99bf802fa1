"""Runs ``ckptfs`` commands in forked children under a time and address-space bound.

Started once (``python runner.py``) with ckptfs already imported, it reads one
JSON request per line — ``{"argv": [...], "timeout": s, "memory": bytes}`` —
forks a child that sets ``RLIMIT_AS`` (unless memory is 0), runs ``ckptfs.cli.main(argv)`` exactly
as the console script does (an uncaught exception prints its traceback and
exits 1), and answers one JSON line: exit code, whether it was killed, wall and
CPU time, peak RSS, stdout and stderr. Forking keeps each case to a few
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

from ckptfs.cli import main as cli

POLL = 0.002


def _child(argv: list[str], memory: int, out_fd: int, err_fd: int) -> None:
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    if memory:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    code = 1
    try:
        code = cli.main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def run(argv: list[str], timeout: float, memory: int) -> dict[str, object]:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:
            _child(argv, memory, out.fileno(), err.fileno())
        timed_out = False
        while True:
            waited, status, usage = os.wait4(pid, os.WNOHANG)
            if waited:
                break
            if time.monotonic() - start > timeout:
                timed_out = True
                os.kill(pid, signal.SIGKILL)
                waited, status, usage = os.wait4(pid, 0)
                break
            time.sleep(POLL)
        wall = time.monotonic() - start
        out.seek(0)
        err.seek(0)
        return {
            "rc": os.waitstatus_to_exitcode(status),
            "timed_out": timed_out,
            "wall": wall,
            "cpu": usage.ru_utime + usage.ru_stime,
            "maxrss": usage.ru_maxrss * 1024,
            "stdout": out.read().decode("utf-8", "replace"),
            "stderr": err.read().decode("utf-8", "replace"),
        }


def main() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        result = run(request["argv"], request["timeout"], request["memory"])
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
