"""Byte sources: exact positioned reads, clear errors, the attributes a mount shows."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mount.helpers import CLI

from ckptfs.errors import SourceError, UnsupportedError
from ckptfs.sources import BytesSource, LocalFileSource, open_source


def test_local_reads_exact_ranges_and_reports_the_file(tmp_path: Path) -> None:
    path = tmp_path / "blob"
    data = bytes(range(256)) * 40
    path.write_bytes(data)
    os.chmod(path, 0o640)
    source = open_source(path)
    try:
        assert isinstance(source, LocalFileSource)
        assert (source.name, source.size) == (str(path), len(data))
        assert source.read(1000, 300) == data[1000:1300]
        assert source.read(len(data), 0) == b""
        st = os.stat(path)
        attributes = source.stat()
        assert attributes is not None
        assert (attributes.size, stat.S_IMODE(attributes.mode), attributes.uid, attributes.mtime_ns) == (
            len(data), 0o640, st.st_uid, st.st_mtime_ns)
        with pytest.raises(SourceError, match=r"read of 2 bytes at offset 10239 is outside the file \(10240 bytes\)"):
            source.read(len(data) - 1, 2)
    finally:
        source.close()


def test_local_read_of_a_file_cut_after_opening_says_so(tmp_path: Path) -> None:
    path = tmp_path / "blob"
    path.write_bytes(b"x" * 4096)
    source = LocalFileSource(path)
    try:
        os.truncate(path, 100)
        with pytest.raises(SourceError, match=r"short read: 0 of 1000 bytes at offset 2000 \(was the file truncated\?\)"):
            source.read(2000, 1000)
    finally:
        source.close()


def test_file_urls_are_local_paths_and_unknown_schemes_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "blob"
    path.write_bytes(b"abc")
    source = open_source(f"file://{path}")
    try:
        assert source.read(0, 3) == b"abc"
    finally:
        source.close()
    with pytest.raises(UnsupportedError, match=r"^nosuch://bucket/m\.pt: fsspec cannot open it: .*nosuch"):
        open_source("nosuch://user:secret@bucket/m.pt?sig=abc")


@pytest.mark.parametrize("make, what", [(lambda p: p.mkdir(), "a directory"), (lambda p: os.mkfifo(p), "not a regular file")])
def test_what_is_not_a_file_is_refused(tmp_path: Path, make, what: str) -> None:
    path = tmp_path / "thing"
    make(path)
    with pytest.raises(SourceError, match=f"{path}: {what}, not a checkpoint file"):
        LocalFileSource(path)


def test_bytes_source_reads_and_bounds() -> None:
    source = BytesSource(b"0123456789", "mem")
    assert source.read(2, 3) == b"234"
    assert source.stat() is None and source.fileno() is None
    with pytest.raises(SourceError, match=r"mem: read of 5 bytes at offset 8 is outside the data \(10 bytes\)"):
        source.read(8, 5)


def test_a_background_mount_reopens_its_source_in_the_daemon(tmp_path: Path) -> None:
    """The seam remote sources need: ``reopen`` runs in the forked daemon, before it serves."""
    source, mnt, marker = tmp_path / "m.pt", tmp_path / "mnt", tmp_path / "reopened"
    torch.save({"w": torch.arange(4, dtype=torch.float32)}, source)
    mnt.mkdir()
    script = (
        "import os, sys\n"
        "from ckptfs.sources.local import LocalFileSource\n"
        "def reopen(self):\n"
        f"    open({str(marker)!r}, 'w').write(str(os.getpid()))\n"
        "LocalFileSource.reopen = reopen\n"
        "from ckptfs.cli.main import run\n"
        "sys.argv = ['ckptfs', 'mount', sys.argv[1], sys.argv[2]]\n"
        "run()\n"
    )
    subprocess.run([sys.executable, "-c", script, str(source), str(mnt)], check=True)
    try:
        assert (mnt / "w").read_bytes() == torch.arange(4, dtype=torch.float32).numpy().tobytes()
        daemon = int(marker.read_text())
        assert daemon != os.getpid() and os.path.exists(f"/proc/{daemon}")
    finally:
        subprocess.run([*CLI, "umount", str(mnt)], check=True)
