"""Where a background daemon's messages go: ``--log-file``, syslog, ``--debug``; the terminal stays quiet."""

from __future__ import annotations

import errno
import re
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from corpus import save_zip

from mount.helpers import CLI, Mounter, daemon_pids, mount_points, run_cli, wait_until
from mount.test_lifecycle import assert_one_line_error, mounted_under

pytestmark = pytest.mark.mount

STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4}"


def _truncate_inside(source: Path, key: str, keep: int) -> None:
    """Cuts the source ``keep`` bytes into the stored record of tensor storage ``key``."""
    with zipfile.ZipFile(source) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(f"/data/{key}"))
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    with open(source, "r+b") as f:
        f.truncate(start + keep)


def test_a_truncated_read_is_logged_with_a_timestamp_in_the_log_file(tmp_path: Path, mounter: Mounter) -> None:
    source = save_zip({"a": torch.ones(4), "b": torch.arange(4096.0)}, tmp_path / "model.pt")
    log = tmp_path / "ckptfs.log"
    log.write_text("an earlier line\n")
    mnt = mounter(source, "--log-file", str(log))
    (daemon,) = daemon_pids(mnt)
    _truncate_inside(source, "1", 64)
    with pytest.raises(OSError) as caught:
        (mnt / "b").read_bytes()
    assert caught.value.errno == errno.EIO
    assert (mnt / "a").read_bytes() == torch.ones(4).numpy().tobytes()
    first, *logged = log.read_text().splitlines()
    assert first == "an earlier line"
    pattern = (rf"{STAMP} ckptfs\[{daemon}\]: ERROR: /b: read of \d+ bytes at offset 0: "
               rf"the source was truncated to {source.stat().st_size} bytes")
    assert logged and all(re.fullmatch(pattern, line) for line in logged), logged  # the kernel may retry the read


def test_a_foreground_mount_with_a_log_file_logs_there_once_it_answers(tmp_path: Path, mounter: Mounter) -> None:
    source = save_zip({"a": torch.ones(4), "b": torch.arange(4096.0)}, tmp_path / "model.pt")
    log = tmp_path / "fg.log"
    mnt = mounter.directory()
    daemon = subprocess.Popen([*CLI, "mount", "-f", "--log-file", str(log), str(source), str(mnt)],
                              stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: str(mnt) in mount_points())
        _truncate_inside(source, "1", 64)
        with pytest.raises(OSError) as caught:
            (mnt / "b").read_bytes()
        assert caught.value.errno == errno.EIO
        assert run_cli("umount", mnt).returncode == 0
        assert daemon.wait(timeout=20) == 0
        assert daemon.stderr is not None and daemon.stderr.read() == ""
    finally:
        daemon.kill()
        daemon.wait()
    logged = log.read_text().splitlines()
    assert logged and all(re.fullmatch(rf"{STAMP} ckptfs\[{daemon.pid}\]: ERROR: /b: read of \d+ bytes at offset 0: "
                                       r"the source was truncated to \d+ bytes", line) for line in logged), logged


def test_debug_in_the_background_logs_every_request_in_the_log_file_only(tmp_path: Path, mounter: Mounter) -> None:
    source = save_zip({"m": {"w": torch.ones(3)}}, tmp_path / "model.pt")
    log = tmp_path / "debug.log"
    mnt = mounter.directory()
    # capture_output waits for every holder of the pipes: a daemon keeping the terminal's stderr would hang it.
    result = run_cli("mount", "--debug", "--log-file", log, source, mnt, timeout=30)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    assert (mnt / "m" / "w").read_bytes() == torch.ones(3).numpy().tobytes()
    text = log.read_text()
    assert re.search(r"opcode: READ\b", text) and re.search(r"opcode: LOOKUP\b", text), text[:2000]
    assert "callback" not in text.lower()  # mfusepy's set-up lines, one per callback


def test_o_debug_without_a_log_file_is_refused_in_the_background(tmp_path: Path) -> None:
    source = save_zip({"w": torch.ones(3)}, tmp_path / "model.pt")
    (tmp_path / "mnt").mkdir()
    assert_one_line_error(run_cli("mount", "-o", "debug", source, tmp_path / "mnt"),
                          r"^ckptfs: --debug in the background needs --log-file PATH "
                          r"\(or -f, to log on the terminal\)$")
    # --debug also asks for tracebacks: a mistake in the arguments is still one line
    for args in (("--debug", "mount"), ("mount", "--debug"), ("mount", "--debug", "-o", "debug")):
        assert_one_line_error(run_cli(*args, source, tmp_path / "mnt"),
                              r"^ckptfs: --debug in the background needs --log-file PATH")
    assert not mounted_under(tmp_path)


def test_a_log_file_that_cannot_be_opened_is_one_line(tmp_path: Path) -> None:
    source = save_zip({"w": torch.ones(3)}, tmp_path / "model.pt")
    (tmp_path / "mnt").mkdir()
    assert_one_line_error(run_cli("mount", "--log-file", tmp_path / "no" / "x.log", source, tmp_path / "mnt"),
                          rf"^ckptfs: {tmp_path}/no/x.log: cannot open the log file: No such file or directory$")
    assert not mounted_under(tmp_path)


def test_log_file_as_a_mount_option(tmp_path: Path, mounter: Mounter) -> None:
    source = save_zip({"w": torch.ones(3)}, tmp_path / "model.pt")
    log = tmp_path / "opt.log"
    mnt = mounter(source, "-o", f"log_file={log},debug")
    assert (mnt / "w").read_bytes() == torch.ones(3).numpy().tobytes()
    assert re.search(r"opcode: READ\b", log.read_text())


SYSLOG_CLIENT = """
import logging, sys
from ckptfs.fuse import daemon_log
print(daemon_log.log_to_syslog(False, sys.argv[1]), flush=True)
logging.getLogger("ckptfs.fuse.mount").error("/b: read of 4096 bytes at offset 0: the source was truncated")
logging.getLogger("ckptfs.fuse.mount").info("not logged")
"""


def test_syslog_gets_the_messages_tagged_and_with_their_level(tmp_path: Path) -> None:
    address = str(tmp_path / "log")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(address)
        server.settimeout(20)
        client = subprocess.run([sys.executable, "-c", SYSLOG_CLIENT, address], capture_output=True, text=True)
        assert (client.returncode, client.stdout, client.stderr) == (0, "True\n", "")
        message = server.recv(4096)
    # <11>: facility user (1) * 8 + severity error (3)
    assert re.fullmatch(rb"<11>ckptfs\[\d+\]: ERROR: /b: read of 4096 bytes at offset 0: "
                        rb"the source was truncated\x00", message), message


def test_without_syslog_there_is_no_syslog_handler(tmp_path: Path) -> None:
    client = subprocess.run([sys.executable, "-c", SYSLOG_CLIENT, tmp_path / "absent"], capture_output=True,
                            text=True)
    assert (client.returncode, client.stdout) == (0, "False\n")
