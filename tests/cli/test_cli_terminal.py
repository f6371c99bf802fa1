"""The command on a terminal and off it: the progress line, Ctrl-C, output errors, one-line messages."""

from __future__ import annotations

import errno
import os
import re
import signal
import subprocess
import sys
import time
import tty
import zipfile
from pathlib import Path

import pytest
from hostile.containers import zip_checkpoint
from hostile.picklegen import EMPTY_DICT, MARK, SETITEMS, i, ints, pickle, s, storage_pid, tensor_v2
from mount.helpers import mount_points

CLI = [sys.executable, "-m", "ckptfs.cli"]
BIG_TENSORS = 100_000
"""Enough for a parse of seconds: hand-made records (not torch's layout) take ckptfs' general path."""
PURE_PYTHON = {**os.environ, "CKPTFS_PICKLE_COMPILED": "0"}
"""The interpreter's progress: the compiled scanner reads these records in a tenth of the line's delay."""
PROGRESS = re.compile(rb"\rckptfs: reading the pickle: (\d+)% \((\d+\.\d) MiB of (\d+\.\d) MiB\) *")


def state_dict_checkpoint(path: Path, count: int, data: bytes = bytes(16)) -> Path:
    """``count`` tensors ``layers.N.weight``, each a view of one 4-float storage holding ``data``."""
    tensor = tensor_v2(storage_pid("FloatStorage", "0", 4), i(0), ints(4), ints(1))
    body = EMPTY_DICT + MARK + b"".join(s(f"layers.{n}.weight") + tensor for n in range(count)) + SETITEMS
    path.write_bytes(zip_checkpoint(pickle(body), {"0": data}))
    return path


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return state_dict_checkpoint(tmp_path_factory.mktemp("big") / "big.pt", BIG_TENSORS)


def _default_sigint() -> None:
    """A shell's background job ignores SIGINT, and a child would inherit that: the real Ctrl-C default instead."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(*argv: str | Path, stderr: int, stdout: int = subprocess.DEVNULL,
          env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """The command, parsing its file each time (--no-cache): these tests watch and interrupt the parse."""
    return subprocess.Popen([*CLI, *map(str, argv), "--no-cache"], stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                            preexec_fn=_default_sigint, env=env)


def wait_until_open(process: subprocess.Popen[bytes], path: Path, timeout: float = 60) -> None:
    """Until the process holds ``path`` open: it is parsing it."""
    deadline = time.monotonic() + timeout
    fds = Path(f"/proc/{process.pid}/fd")
    while True:
        assert process.poll() is None, "the command ended before opening the file"
        assert time.monotonic() < deadline, "the file was never opened"
        try:
            if any(os.readlink(fds / fd) == str(path) for fd in os.listdir(fds)):
                return
        except OSError:
            pass
        time.sleep(0.005)


class Terminal:
    """A pseudo-terminal as the command's stderr, read raw (no newline translation)."""

    def __init__(self) -> None:
        self.master, self.slave = os.openpty()
        tty.setraw(self.slave)
        self.output = b""

    def start(self, *argv: str | Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        process = start(*argv, stderr=self.slave, env=env)
        os.close(self.slave)
        return process

    def read_until(self, pattern: re.Pattern[bytes], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not pattern.search(self.output):
            assert time.monotonic() < deadline, self.output[-200:]
            self.output += os.read(self.master, 4096)

    def read_to_end(self) -> bytes:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError as exc:  # EIO: every copy of the slave side is closed
                assert exc.errno == errno.EIO
                break
            if not data:
                break
            self.output += data
        os.close(self.master)
        return self.output


def screen(output: bytes) -> list[str]:
    """What a terminal shows after ``output``: ``\\r`` returns to the line's start, later characters overwrite."""
    lines, column = [[]], 0
    for char in output.decode():
        if char == "\r":
            column = 0
        elif char == "\n":
            lines.append([])
            column = 0
        else:
            line = lines[-1]
            line[column:column + 1] = [char]
            column += 1
    return ["".join(line).rstrip() for line in lines]


def test_progress_on_a_terminal(big: Path) -> None:
    terminal = Terminal()
    process = terminal.start("ls", big, env=PURE_PYTHON)
    output = terminal.read_to_end()
    assert process.wait(timeout=120) == 0
    shown = PROGRESS.findall(output)
    assert len(shown) >= 2, output[:300]
    pickle_mib = len(zipfile.ZipFile(big).read("archive/data.pkl")) / (1 << 20)
    assert all(total == f"{pickle_mib:.1f}".encode() for _, _, total in shown)
    percents = [int(percent) for percent, _, _ in shown]
    assert percents == sorted(percents) and all(0 <= p <= 100 for p in percents)
    assert b"\n" not in output and output.endswith(b"\r")
    assert screen(output) == [""]


def test_diff_progress_on_a_terminal(big: Path, tmp_path: Path) -> None:
    """Comparing 100,000 tensors that all differ shows how many are compared, counting up to all of them."""
    other = state_dict_checkpoint(tmp_path / "other.pt", BIG_TENSORS, bytes(range(16)))
    terminal = Terminal()
    process = terminal.start("diff", big, other)
    output = terminal.read_to_end()
    assert process.wait(timeout=300) == 1
    shown = re.findall(rb"\rckptfs: comparing tensors: ([\d,]+) of ([\d,]+) \(\d+\.\d MiB read\)", output)
    assert shown, output[:300]
    compared = [int(done.replace(b",", b"")) for done, _ in shown]
    assert compared == sorted(compared) and {total for _, total in shown} == {b"100,000"}
    assert screen(output) == [""]


def test_no_progress_on_a_pipe(big: Path) -> None:
    result = subprocess.run([*CLI, "ls", str(big)], capture_output=True, timeout=120)
    assert result.returncode == 0 and result.stderr == b""
    assert result.stdout.count(b"\n") == BIG_TENSORS


def test_interrupted_on_a_terminal(big: Path) -> None:
    """Ctrl-C clears the progress line and leaves one line in its place."""
    terminal = Terminal()
    process = terminal.start("info", big, env=PURE_PYTHON)
    terminal.read_until(PROGRESS)
    process.send_signal(signal.SIGINT)
    output = terminal.read_to_end()
    assert process.wait(timeout=60) == 130
    assert screen(output) == ["ckptfs: interrupted", ""]


@pytest.mark.parametrize("command", [["ls"], ["info"], ["info", "--json"], ["mount"]])
def test_interrupted(big: Path, tmp_path: Path, command: list[str]) -> None:
    """SIGINT while the file is parsed: one line, exit 130, and (for mount) nothing mounted."""
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    argv = [*command, big, mountpoint] if command == ["mount"] else [*command, big]
    process = start(*argv, stderr=subprocess.PIPE, stdout=subprocess.PIPE)
    wait_until_open(process, big)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    assert (process.returncode, stdout, stderr) == (130, b"", b"ckptfs: interrupted\n")
    assert str(mountpoint) not in mount_points() and os.listdir(mountpoint) == []


@pytest.mark.parametrize("command", [["ls"], ["ls", "--json"], ["info"], ["info", "--json", "--indent", "1"]])
def test_a_full_disk_is_one_line(tmp_path: Path, command: list[str]) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    path = state_dict_checkpoint(tmp_path / "small.pt", 10)
    with open("/dev/full", "wb") as full:
        result = subprocess.run([*CLI, *command, str(path)], stdout=full, stderr=subprocess.PIPE, timeout=60)
    assert (result.returncode, result.stderr) == (1, b"ckptfs: writing the output: No space left on device\n")


def test_a_closed_pipe_ends_silently(tmp_path: Path) -> None:
    path = state_dict_checkpoint(tmp_path / "medium.pt", 5000)  # ~250 KB of lines: more than a pipe holds
    process = start("ls", path, stderr=subprocess.PIPE, stdout=subprocess.PIPE)
    assert process.stdout is not None and process.stderr is not None
    assert process.stdout.readline().startswith(b"layers.0.weight  ")
    process.stdout.close()
    assert process.wait(timeout=60) == 0
    assert process.stderr.read() == b""


def test_messages_with_control_characters_stay_one_line(tmp_path: Path) -> None:
    """Control characters print as ``\\n``, ``\\x1b`` …; an undecodable byte of a file name as ``\\xNN``."""
    missing = os.fsencode(tmp_path) + b"/a\nb\x1b[31m\xff.pt"
    result = subprocess.run([*map(os.fsencode, CLI), b"ls", missing], capture_output=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr == (f"ckptfs: {tmp_path}/a\\nb\\x1b[31m\\xff.pt: cannot open: "
                             "No such file or directory\n").encode()
    source = state_dict_checkpoint(tmp_path / "small.pt", 1)
    mountpoint = tmp_path / "no\nsuch\tdir"
    result = subprocess.run([*CLI, "mount", str(source), str(mountpoint)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr == f"ckptfs: {tmp_path}/no\\nsuch\\tdir: mount point does not exist\n"


@pytest.mark.parametrize(("argv", "error"), [
    (["ls", "--limit", "max_tensors=1\n2", "x"], "ckptfs ls: error: argument --limit: max_tensors: '1\\n2' is not"),
    (["ls", "--bogus\x1b[2J", "x"], "ckptfs: error: unrecognized arguments: --bogus\\x1b[2J"),
])
def test_usage_errors_stay_two_lines(argv: list[str], error: str) -> None:
    result = subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("usage: ckptfs ") and lines[1].startswith(error), lines
