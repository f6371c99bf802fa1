"""Assertions shared by the hostile tests: what a clean failure and a bounded run look like."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any, Callable, Iterator

import ckptfs
from ckptfs.cli.info import description_text
from ckptfs.errors import CkptfsError, LimitExceededError
from ckptfs.pickle import cscan, unpickler
from hostile.conftest import HANG_SECONDS, MEMORY_BOUND, READ_BOUND, WRITE_BOUND, CliResult

TRUNCATION_REASONS = (r"empty file|not a PyTorch checkpoint|no zip end-of-central-directory record"
                      r"|zip file too short|pickle truncated|legacy storages end at byte \d+ but the file has"
                      r"|tar archive ends at byte|tar member at offset \d+ \(\d+ bytes\) runs past the end")


def assert_names_file(error: CkptfsError, path: Path, reason: str) -> None:
    """The error names the file and says what is wrong, in the one-line form the CLI prints."""
    assert error.path == str(path)
    assert str(error) == f"{path}: {error.reason}"
    assert "\n" not in str(error)
    assert re.search(reason, error.reason), f"{error.reason!r} does not match {reason!r}"


def exercise(ck: ckptfs.Checkpoint, describe_reason: str = "") -> None:
    """What ``info --json`` and a reader do: describe the whole checkpoint, read the ends of every tensor.

    ``describe_reason``: the description must fail with LimitExceededError, for this reason.
    """
    try:
        description_text(ck)
        assert not describe_reason, "the description should have been refused"
    except LimitExceededError as exc:
        assert describe_reason and re.search(describe_reason, exc.reason), exc
    for tensor in ck.tensors:
        for offset in (0, max(0, tensor.nbytes - 4096)):
            try:
                ck.read(tensor, offset, 4096)
            except CkptfsError as exc:
                assert exc.path == ck.path


def assert_bounded(result: CliResult) -> None:
    """The run's work within counts that do not drift with the machine's load; time only as a hang guard."""
    assert not result.timed_out and result.wall < HANG_SECONDS, f"hung: killed after {result.wall:.1f} s"
    assert result.read <= READ_BOUND, f"read {result.read:,} bytes"
    assert result.written <= WRITE_BOUND, f"wrote {result.written:,} bytes"
    assert result.maxrss < MEMORY_BOUND, f"peak RSS {result.maxrss >> 20} MiB"
    assert "Traceback" not in result.stderr, result.stderr


def assert_cli_error(result: CliResult, path: Path, reason: str) -> None:
    """Exit status 1 and exactly one line, ``ckptfs: FILE: REASON``."""
    assert result.rc == 1, (result.rc, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    prefix = f"ckptfs: {path}: "
    assert lines[0].startswith(prefix), lines[0]
    assert re.search(reason, lines[0][len(prefix):]), f"{lines[0]!r} does not match {reason!r}"


@contextlib.contextmanager
def fast_paths(on: bool) -> Iterator[None]:
    """The unpickler's fast paths on or off (off: every opcode through its table step, the reference)."""
    saved = unpickler.FAST_PATHS
    unpickler.FAST_PATHS = on
    try:
        yield
    finally:
        unpickler.FAST_PATHS = saved


@contextlib.contextmanager
def compiled_scanner(on: bool) -> Iterator[None]:
    """The compiled scanners (zip and DCP pickles) used (when built) or not: off, the pure-Python fast paths parse."""
    saved = cscan.ENABLED
    cscan.ENABLED = on
    try:
        yield
    finally:
        cscan.ENABLED = saved


def three_paths(make: Callable[[], Any]) -> tuple[Any, Any, Any]:
    """``make()`` with the compiled scanner, on the pure-Python fast paths, and on the reference interpreter."""
    with compiled_scanner(True):
        compiled = make()
    with compiled_scanner(False):
        python = make()
        with fast_paths(False):
            reference = make()
    return compiled, python, reference
