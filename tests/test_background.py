"""``ckptfs.background``: a task run in a detached process that the caller does not wait for."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import pytest
from mount.helpers import wait_until

from ckptfs import background


def test_the_task_runs_in_a_niced_process_of_its_own_that_the_caller_does_not_wait_for(tmp_path: Path) -> None:
    go, done = tmp_path / "go", tmp_path / "done"

    def task() -> None:
        deadline = time.monotonic() + 60
        while not go.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        facts = [str(os.getpid()), str(os.getsid(0)), str(os.nice(0)),
                 *(os.readlink(f"/proc/self/fd/{fd}") for fd in (0, 1, 2)), str(go.exists())]
        temp = tmp_path / "done.tmp"
        temp.write_text(" ".join(facts))
        temp.rename(done)

    background.run_in_background(task)  # returns while the task still waits for "go"
    assert not done.exists()
    go.touch()
    wait_until(done.exists, timeout=60)
    pid, session, niceness, *streams, went = done.read_text().split()
    assert int(pid) != os.getpid() and int(session) != os.getsid(0) and int(niceness) == min(19, os.nice(0) + 19)
    assert streams == ["/dev/null"] * 3 and went == "True"


def test_no_process_made_means_no_task_and_no_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused() -> int:
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    ran = []
    monkeypatch.setattr(background, "fork", refused)
    background.run_in_background(lambda: ran.append(1))
    assert ran == []
