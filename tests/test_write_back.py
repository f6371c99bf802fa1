"""``ckptfs.write_back``: work behind a writer, in order and bounded; writeback started a unit at a time."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

import ckptfs.write_back
from ckptfs.write_back import BEHIND, UNIT, Behind, WriteBack


def test_behind_runs_tasks_in_submission_order_on_one_thread() -> None:
    done: list[tuple[int, str]] = []
    behind = Behind("test")
    try:
        for n in range(200):
            behind.submit(lambda n=n: done.append((n, threading.current_thread().name)))
        behind.wait()
    finally:
        behind.close()
    assert [n for n, _ in done] == list(range(200))
    assert {name for _, name in done} == {"ckptfs-test_0"}


def test_behind_holds_at_most_its_bound_and_then_waits() -> None:
    release = threading.Event()
    started = threading.Event()
    submitted = []
    behind = Behind("test")

    def first() -> None:
        started.set()
        release.wait()

    def submit_all() -> None:
        behind.submit(first)
        started.wait()
        for n in range(BEHIND + 5):
            behind.submit(lambda: None)
            submitted.append(n)

    writer = threading.Thread(target=submit_all)
    writer.start()
    try:
        started.wait()
        # Reaching the bound takes the writer a moment that depends on the machine's load: wait for it, then give it
        # as long again to pass the bound, which it cannot while `first` runs.
        for _ in range(600):
            if len(submitted) >= BEHIND - 1:
                break
            writer.join(0.05)
        writer.join(0.5)
        assert writer.is_alive()
        assert len(submitted) == BEHIND - 1
    finally:
        release.set()
        writer.join()
        behind.wait()
        behind.close()
    assert len(submitted) == BEHIND + 5


def test_behind_raises_the_first_error_and_close_drops_the_rest() -> None:
    ran = []
    behind = Behind("test")

    def fails() -> None:
        raise OSError(28, "No space left on device")

    behind.submit(lambda: ran.append(1))
    behind.submit(fails)
    behind.submit(lambda: ran.append(3))
    with pytest.raises(OSError, match="No space left"):
        behind.wait()
    behind.close()
    assert ran[0] == 1


def test_writeback_starts_consecutive_writes_a_unit_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[tuple[int, int, int, int]] = []
    monkeypatch.setattr(ckptfs.write_back, "_START", lambda *args: started.append(args) or 0)
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        write_back = WriteBack(fd)
        step = UNIT // 4
        for n in range(9):  # two whole units, then a quarter left over
            write_back.written(n * step, step)
        write_back.written(100 * UNIT, 10)  # elsewhere: what was gathered is started
        write_back.written(100 * UNIT + 10, 5)
        write_back._behind.wait()  # type: ignore[union-attr]  # close drops what has not started
        write_back.close()
    finally:
        os.close(fd)
    assert started == [(fd, 0, UNIT, 2), (fd, UNIT, UNIT, 2), (fd, 2 * UNIT, step, 2)]


def test_writeback_calls_the_kernel_and_it_accepts_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On Linux, sync_file_range itself: each call returns 0 (wrong arguments would give -1, EINVAL)."""
    real = ckptfs.write_back._START
    if real is None:
        pytest.skip("no sync_file_range here")
    results: list[int] = []
    monkeypatch.setattr(ckptfs.write_back, "_START", lambda *args: results.append(real(*args)))
    path = tmp_path / "f"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        write_back = WriteBack(fd)
        data = os.urandom(UNIT)
        for n in range(3):
            os.pwrite(fd, data, n * UNIT)
            write_back.written(n * UNIT, UNIT)
        write_back.written(0, 1)
        write_back._behind.wait()  # type: ignore[union-attr]
        write_back.close()
    finally:
        os.close(fd)
    assert results == [0, 0, 0]
    assert path.read_bytes() == data * 3
