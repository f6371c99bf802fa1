"""What every bench section shares: where things are, logging, timing a command, the page cache, /proc."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import os
import shlex
import stat
import struct
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LIB = Path(__file__).resolve().parent
REPO = LIB.parent.parent
VENV_BIN = Path(sys.executable).parent
GiB = 1 << 30
MiB = 1 << 20


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class BenchError(Exception):
    pass




def made_before(manifest: Path, want: dict[str, Any], output: Path) -> bool:
    """Whether ``output``, from an earlier ``--keep`` run, was made as ``want`` says (``manifest`` holds what it was
    made as: written by ``made_as`` once it is complete)."""
    try:
        return json.loads(manifest.read_text()) == want and output.exists()
    except (OSError, ValueError):
        return False


def made_as(manifest: Path, want: dict[str, Any]) -> None:
    manifest.write_text(json.dumps(want))


def run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, **kw)


def timed(argv: list[str], stdin: Any = None, stdout: Any = subprocess.DEVNULL) -> float:
    """Wall seconds of one command (spawn included: ~1 ms, the same for every side)."""
    t0 = time.perf_counter()
    proc = subprocess.run(argv, stdin=stdin, stdout=stdout, stderr=subprocess.PIPE)
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace")[-500:]
        raise BenchError(f"{shlex.join(argv)} failed ({proc.returncode}): {err}")
    return dt


def mountpoints() -> set[str]:
    points = set()
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            raw = line.split(b" ")[4].decode("utf-8", "surrogateescape")
            for esc, ch in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
                raw = raw.replace(esc, ch)
            points.add(raw)
    return points


def loadavg() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def drop_cache(path: str) -> None:
    """Drops one file's page cache (posix_fadvise DONTNEED); other files stay cached."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]


_EVEN_BYTES = bytes(range(0, 256, 2))


def resident(path: str, offset: int = 0, length: int | None = None) -> float | None:
    """Fraction of [offset, offset+length) of a file in the page cache (mincore; reads nothing).

    None where the kernel hides it: mincore() shows a file's page cache only to root, to the file's owner and to
    whom may write it, and calls every page resident for anyone else.
    """
    page = os.sysconf("SC_PAGE_SIZE")
    fd = os.open(path, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        if os.geteuid() not in (0, st.st_uid) and not os.access(path, os.W_OK):
            return None
        size = st.st_size
        length = size - offset if length is None else length
        start = offset // page * page
        span = offset + length - start
        if span <= 0:
            return 1.0
        addr = _libc.mmap(None, span, 1, 1, fd, start)  # PROT_READ, MAP_SHARED
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap for mincore failed")
        try:
            npages = (span + page - 1) // page
            vec = ctypes.create_string_buffer(npages)
            if _libc.mincore(addr, span, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed")
            return len(vec.raw.translate(None, _EVEN_BYTES)) / npages  # pages whose byte has bit 0 set
        finally:
            _libc.munmap(addr, span)
    finally:
        os.close(fd)


def warm(path: str, offset: int, length: int) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)
        pos, end = offset, offset + length
        while pos < end:
            n = len(os.pread(fd, min(8 * MiB, end - pos), pos))
            if n == 0:
                break
            pos += n
    finally:
        os.close(fd)


@dataclass
class ProcStat:
    minflt: int
    majflt: int
    cpu_s: float
    threads: int


def proc_stat(pid: int | None) -> ProcStat | None:
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return ProcStat(int(rest[7]), int(rest[9]), (int(rest[11]) + int(rest[12])) / tick, int(rest[17]))


def proc_status_kib(pid: int | None, key: str) -> int | None:
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def bdi_read_ahead_path(mnt: str) -> Path:
    st = os.stat(mnt)
    return Path(f"/sys/class/bdi/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/read_ahead_kb")


def read_ahead_kb(mnt: str) -> int | None:
    try:
        return int(bdi_read_ahead_path(mnt).read_text())
    except OSError:
        return None


def _command_lines() -> list[tuple[int, list[bytes]]]:
    """Every other process's pid and command line (those gone meanwhile left out)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            with contextlib.suppress(OSError):
                found.append((int(entry), Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")))
    return found


def fuse_daemon_pids(mnt: str) -> list[int]:
    """Processes holding /dev/fuse open whose command line names the mount point."""
    pids = []
    for pid, cmdline in _command_lines():
        if not any(os.fsencode(mnt) == arg.rstrip(b"/") for arg in cmdline):
            continue
        with contextlib.suppress(OSError):
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") == "/dev/fuse" for fd in fds):
                pids.append(pid)
    return pids




def wait_for_cache_writers(cache_dir: Path, timeout: float = 60.0) -> None:
    """Waits until no process names ``cache_dir`` on its command line: a ckptfs ``mount`` or ``ls`` writes its metadata
    cache entry from a fork of itself that it does not wait for, and what is measured next runs alone."""
    named = os.fsencode(str(cache_dir))
    deadline = time.monotonic() + timeout
    while True:
        running = [str(pid) for pid, cmdline in _command_lines() if named in cmdline]
        if not running:
            return
        if time.monotonic() > deadline:
            raise BenchError(f"processes {', '.join(running)} still write to {cache_dir} after {timeout:.0f} s")
        time.sleep(0.02)


def zip_record_span(path: str, suffix: str) -> tuple[int, int]:
    """(offset, size) of a stored zip record's data, found with the stdlib (independent of ckptfs)."""
    with zipfile.ZipFile(path) as zf:
        info = next(i for i in zf.infolist() if i.filename.endswith(suffix))
        if info.compress_type != zipfile.ZIP_STORED:
            raise BenchError(f"{info.filename} is compressed")
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        header = f.read(30)
        if header[:4] != b"PK\x03\x04":
            raise BenchError("bad local header")
        name_len, extra_len = struct.unpack("<HH", header[26:30])
    return info.header_offset + 30 + name_len + extra_len, info.file_size


def find_file_of_size(root: str, size: int) -> str:
    hits = []
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = os.path.join(dirpath, name)
            with contextlib.suppress(OSError):
                if os.stat(p).st_size == size:
                    hits.append(p)
    if len(hits) != 1:
        raise BenchError(f"expected one file of {size} bytes under {root}, found {hits[:5]}")
    return hits[0]


def write_root_entries(mnt: str, path: Path, tree: bool = False) -> int:
    """The mount root's entries (``tree``: every entry below it, each directory's after the directory's own line), in
    listing order, as ``listing.c`` reads them: ``KIND SIZE PATH`` lines, PATH relative to the root."""
    lines: list[str] = []
    pending = [""]
    while pending:
        folder = pending.pop()
        found: list[str] = []
        with os.scandir(os.path.join(mnt, folder)) as it:
            for entry in it:
                st = entry.stat(follow_symlinks=False)
                if "\n" in entry.name:
                    raise BenchError(f"{mnt}: an entry name holds a newline: {entry.name!r}")
                name = f"{folder}/{entry.name}" if folder else entry.name
                lines.append(f"{'d' if stat.S_ISDIR(st.st_mode) else 'f'} {st.st_size} {name}\n")
                if tree and stat.S_ISDIR(st.st_mode):
                    found.append(name)
        pending.extend(reversed(found))
    path.write_text("".join(lines), encoding="utf-8", errors="surrogateescape")
    return len(lines)


def same_bytes(a: str, a_off: int, b: str, b_off: int, length: int, samples: int = 16) -> None:
    """Compares sampled 1 MiB chunks (first, last and spread) of two byte ranges."""
    chunk = min(MiB, length)
    positions = sorted({0, length - chunk, *[(length - chunk) * i // (samples - 1) for i in range(samples)]})
    with open(a, "rb", buffering=0) as fa, open(b, "rb", buffering=0) as fb:
        for pos in positions:
            if os.pread(fa.fileno(), chunk, a_off + pos) != os.pread(fb.fileno(), chunk, b_off + pos):
                raise BenchError(f"{b} differs from {a} at +{pos}")
