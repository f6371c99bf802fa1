"""Side-by-side benchmark of ckptfs against the limits it should approach (run it as ``scripts/bench``).

Every figure is measured for ckptfs and for its limit in the same run, pair by pair
(each run measures every side back to back), and reported as the median over runs of
the per-run ratio, so drift of the machine cancels:

* raw     the same byte range of the .pt read directly (the physical limit; the source is warm)
* cpass   a minimal C pass-through on libfuse3 exposing that byte range (the kernel's FUSE limit)
* clist   a C file system listing the root ckptfs shows (mount and ``find -ls`` figures)
* floor   a Python process reading the pickle with the C unpickler (``pickle_floor.py``), plus clist
* ckptfs  the tensor file of ``ckptfs mount``
* ratar   the same record through ratarmount (``--ratarmount``)
* torch   ``torch.load(mmap=True, weights_only=True)`` + names and shapes (legacy: plain load)

See ``scripts/bench --help`` and the README's "Benchmark" section.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import gc
import hashlib
import json
import os
import platform
import shlex
import shutil
import signal
import stat
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import scale
import views
from metadata_cache import NO_CACHE_HOME, run_cached

LIB = Path(__file__).resolve().parent
REPO = LIB.parent.parent
VENV_BIN = Path(sys.executable).parent
GiB = 1 << 30
MiB = 1 << 20

SECTIONS = ("seq", "memmap", "rand", "many", "cache")
OPTIONAL_SECTIONS = ("views", "scale", "remote", "distributed")
SEQ_TOOLS = ("dd_1M", "dd_128k", "cat")


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class BenchError(Exception):
    pass


# --------------------------------------------------------------------------- small system helpers


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
            return np.frombuffer(vec.raw, dtype=np.uint8).__and__(1).mean().item()
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


def fuse_daemon_pids(mnt: str) -> list[int]:
    """Processes holding /dev/fuse open whose command line names the mount point."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            if not any(os.fsencode(mnt) == arg.rstrip(b"/") for arg in cmdline):
                continue
            fds = os.listdir(f"/proc/{entry}/fd")
            if any(os.readlink(f"/proc/{entry}/fd/{fd}") == "/dev/fuse" for fd in fds):
                pids.append(int(entry))
        except OSError:
            continue
    return pids


# --------------------------------------------------------------------------- mounts and their cleanup


@dataclass
class Mount:
    name: str
    mnt: str
    proc: subprocess.Popen
    log_path: str
    daemon: bool = False
    ready_s: float = 0.0
    pid: int | None = None


def _end_process(proc: subprocess.Popen, grace: float = 0.0) -> None:
    """Waits ``grace`` seconds for a process to exit, then terminates it, then kills it."""
    for action in (None, proc.terminate, proc.kill):
        if action is not None:
            with contextlib.suppress(ProcessLookupError):
                action()
        try:
            proc.wait(timeout=grace if action is None else 5)
            return
        except subprocess.TimeoutExpired:
            continue


class MountManager:
    """Starts FUSE daemons in their own sessions (Ctrl-C reaches only us) and always unmounts them."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.live: list[Mount] = []

    def start(self, name: str, argv: list[str], mnt: str, env: dict[str, str] | None = None,
              timeout: float = 120.0, daemon: bool = False) -> Mount:
        """Runs a mount command; ``daemon``: it returns once mounted (else it serves in the foreground)."""
        os.makedirs(mnt, exist_ok=True)
        if mnt in mountpoints():
            raise BenchError(f"{mnt} is already a mount point")
        log_path = str(self.workdir / f"{name}.log")
        logf = open(log_path, "ab")
        logf.write(f"\n$ {shlex.join(argv)}\n".encode())
        logf.flush()
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env)
        logf.close()
        m = Mount(name, mnt, proc, log_path, daemon)
        self.live.append(m)
        deadline = t0 + timeout
        if daemon:  # the command itself returns once the mount answers; the daemon lives on, detached
            # Polled every millisecond: Popen.wait(timeout=...) sleeps up to 50 ms between its polls.
            while (code := proc.poll()) is None:
                if time.perf_counter() > deadline:
                    raise BenchError(f"{name}: {shlex.join(argv)} still running after {timeout:.0f} s")
                time.sleep(0.001)
            if code != 0:
                raise BenchError(f"{name}: {shlex.join(argv)} exited with {code}; log:\n{self.tail(m)}")
            os.listdir(mnt)
            m.ready_s = time.perf_counter() - t0
            if mnt not in mountpoints():
                raise BenchError(f"{name}: {shlex.join(argv)} returned but {mnt} is not mounted")
        while not daemon:
            if mnt in mountpoints():
                os.listdir(mnt)  # blocks until the daemon answers: the mount is usable
                m.ready_s = time.perf_counter() - t0
                break
            code = proc.poll()
            if code not in (None, 0):
                raise BenchError(f"{name}: {shlex.join(argv)} exited with {code}; log:\n{self.tail(m)}")
            if time.perf_counter() > deadline:
                raise BenchError(f"{name}: not mounted after {timeout:.0f} s; log:\n{self.tail(m)}")
            time.sleep(0.001)
        pids = fuse_daemon_pids(mnt)
        m.pid = proc.pid if proc.pid in pids or (not pids and proc.poll() is None) else (pids[0] if pids else None)
        if m.pid is None:
            log(f"warning: {name}: no daemon process found for {mnt}; RSS and CPU figures are missing")
        return m

    @staticmethod
    def tail(m: Mount) -> str:
        try:
            return Path(m.log_path).read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def stop(self, m: Mount) -> None:
        """Unmounts and waits for the daemon to exit (terminating what does not)."""
        if m.daemon and m.proc.poll() is None:  # interrupted while the mount command still runs
            _end_process(m.proc)
        pids = {p for p in [m.pid, *fuse_daemon_pids(m.mnt)] if p and p != m.proc.pid}
        if m.mnt in mountpoints():
            for _ in range(20):
                res = subprocess.run(["fusermount3", "-u", m.mnt], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
                if res.returncode == 0 or m.mnt not in mountpoints():
                    break
                time.sleep(0.1)  # busy: a reader of ours is still closing
            else:
                subprocess.run(["fusermount3", "-uz", m.mnt], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _end_process(m.proc, grace=10)
        deadline = time.time() + 10
        for pid in pids:
            while time.time() < deadline and Path(f"/proc/{pid}").exists():
                time.sleep(0.02)
            if Path(f"/proc/{pid}").exists():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        if m in self.live:
            self.live.remove(m)

    def stop_all(self) -> None:
        for m in reversed(list(self.live)):
            try:
                self.stop(m)
            except Exception as exc:  # keep cleaning the others
                log(f"cleanup of {m.mnt}: {exc}")
        # Belt and braces: anything still mounted under the work directory.
        prefix = str(self.workdir) + "/"
        for point in sorted(mountpoints(), reverse=True):
            if point.startswith(prefix):
                subprocess.run(["fusermount3", "-uz", point], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# --------------------------------------------------------------------------- results


@dataclass
class Figure:
    key: str
    label: str
    unit: str  # "GB/s", "s", "us", "MiB"
    values: dict[str, list[float]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def add(self, side: str, value: float) -> None:
        self.values.setdefault(side, []).append(value)

    def median(self, side: str) -> float | None:
        vals = self.values.get(side)
        return statistics.median(vals) if vals else None


@dataclass
class Check:
    figure: str
    num: str
    den: str | None  # None: an absolute target on num's value
    op: str  # ">=" or "<="
    target: float | None
    label: str


class Results:
    def __init__(self) -> None:
        self.figures: dict[str, Figure] = {}
        self.checks: list[Check] = []
        self.meta: dict[str, Any] = {}

    def fig(self, key: str, label: str, unit: str) -> Figure:
        if key not in self.figures:
            self.figures[key] = Figure(key, label, unit)
        return self.figures[key]

    def ratio_runs(self, c: Check) -> list[float]:
        f = self.figures.get(c.figure)
        if f is None or c.num not in f.values:
            return []
        if c.den is None:
            return list(f.values[c.num])
        if c.den not in f.values:
            return []
        return [a / b for a, b in zip(f.values[c.num], f.values[c.den]) if b]

    def evaluate(self, c: Check) -> tuple[float | None, bool | None]:
        vals = self.ratio_runs(c)
        if not vals:
            return None, None
        med = statistics.median(vals)
        if c.target is None:
            return med, None
        return med, (med >= c.target if c.op == ">=" else med <= c.target)

    def to_json(self) -> dict[str, Any]:
        figs = {}
        for key, f in self.figures.items():
            figs[key] = {
                "label": f.label,
                "unit": f.unit,
                "sides": {s: {"runs": v, "median": statistics.median(v)} for s, v in f.values.items() if v},
                **({"extra": f.extra} if f.extra else {}),
            }
        checks = []
        for c in self.checks:
            med, met = self.evaluate(c)
            if med is None:
                continue
            checks.append({
                "figure": c.figure, "label": c.label, "numerator": c.num, "denominator": c.den,
                "runs": self.ratio_runs(c), "median": med,
                "target": None if c.target is None else f"{c.op} {c.target}", "met": met,
            })
        return {"meta": self.meta, "figures": figs, "checks": checks}


def fmt_value(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "GB/s":
        return f"{v:.2f} GB/s"
    if unit == "s":
        return f"{v * 1000:.0f} ms" if v < 10 else f"{v:.1f} s"
    if unit == "us":
        return f"{v:.1f} us"
    if unit == "MiB":
        return f"{v:.1f} MiB"
    return f"{v:.3g} {unit}"


def render_table(res: Results) -> str:
    sides = ["raw", "cpass", "clist", "cpickle", "floor", "tensorfile", "ckptfs", "alt", "ratar", "torch"]
    present = [s for s in sides if any(s in f.values for f in res.figures.values())]
    lines = []
    head = ["figure"] + present
    rows = []
    for f in res.figures.values():
        rows.append([f.label] + [fmt_value(f.median(s), f.unit) for s in present])
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    lines.append("Medians (%s):" % ", ".join(
        {"raw": "raw = .pt byte range read directly", "cpass": "cpass = C libfuse3 pass-through",
         "clist": "clist = C libfuse3 file system listing the root entries ckptfs lists",
         "cpickle": "cpickle = Python process reading the pickle with the C unpickler",
         "floor": "floor = cpickle + clist",
         "ckptfs": "ckptfs = tensor file of ckptfs mount", "alt": "alt = ckptfs from --alt-root/--alt-env",
         "ratar": "ratar = ratarmount",
         "torch": "torch = torch.load(+mmap) and listing", **views.SIDE_NOTES}[s] for s in present))
    lines.append("  ".join(h.ljust(w) for h, w in zip(head, widths)))
    lines.append("  ".join("-" * w for w in widths))
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    lines.append("")
    lines.append("Ratios (median of per-run ratios) against targets:")
    crow = [["check", "median", "target", "met"]]
    for c in res.checks:
        med, met = res.evaluate(c)
        if med is None:
            continue
        unit = res.figures[c.figure].unit
        shown = fmt_value(med, unit) if c.den is None else f"{med:.3f}x"
        target = "-" if c.target is None else (
            f"{c.op} {fmt_value(c.target, unit)}" if c.den is None else f"{c.op} {c.target}x")
        crow.append([c.label, shown, target, "-" if met is None else ("yes" if met else "NO")])
    widths = [max(len(r[i]) for r in crow) for i in range(4)]
    for i, r in enumerate(crow):
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


# --------------------------------------------------------------------------- the benchmark


class TorchWorker:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, str(LIB / "torch_worker.py")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        self.hello = self._recv()

    def _recv(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise BenchError("torch worker died (is torch installed? scripts/setup --test)")
        return json.loads(line)

    def call(self, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        out = self._recv()
        if not out.get("ok"):
            raise BenchError(f"torch worker: {out.get('error')}")
        return out

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(Exception):
                assert self.proc.stdin is not None
                self.proc.stdin.write('{"op": "quit"}\n')
                self.proc.stdin.flush()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


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


def write_root_entries(mnt: str, path: Path) -> int:
    """The mount root's entries, in listing order, as ``listing.c`` reads them: ``KIND SIZE NAME`` lines."""
    lines = []
    with os.scandir(mnt) as it:
        for entry in it:
            st = entry.stat(follow_symlinks=False)
            if "\n" in entry.name:
                raise BenchError(f"{mnt}: an entry name holds a newline: {entry.name!r}")
            lines.append(f"{'d' if stat.S_ISDIR(st.st_mode) else 'f'} {st.st_size} {entry.name}\n")
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


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.res = Results()
        self.workdir: Path = Path()
        self.own_workdir = False
        self.mounts: MountManager | None = None
        self.torch: TorchWorker | None = None
        self.bin: dict[str, str] = {}
        self.big = self.many = self.legacy = ""
        self.big_off = self.big_len = 0
        self.big_sum = 0.0
        self.n_many = 0
        self.have_ckptfs = True
        self.have_alt = bool(args.alt_root or args.alt_env)

    # ---- set-up

    def setup(self) -> None:
        a = self.args
        for tool in ("gcc", "pkg-config", "fusermount3", "dd", "cat", "find"):
            if shutil.which(tool) is None:
                raise BenchError(f"{tool} not found (scripts/setup --test installs the build tools)")
        if not os.path.exists("/dev/fuse"):
            raise BenchError("/dev/fuse is missing")
        big_bytes = (64 * MiB if a.quick else GiB) if a.big_mib is None else a.big_mib * MiB
        self.n_many = (2000 if a.quick else 20000) if a.tensors is None else a.tensors
        if a.workdir:
            self.workdir = Path(a.workdir).resolve()
            self.own_workdir = not self.workdir.exists()
            self.workdir.mkdir(parents=True, exist_ok=True)
        else:
            base = "/var/tmp" if os.access("/var/tmp", os.W_OK) else tempfile.gettempdir()
            self.workdir = Path(tempfile.mkdtemp(prefix="ckptfs-bench-", dir=base))
            self.own_workdir = True
        free = shutil.disk_usage(self.workdir).free
        if free < big_bytes + 256 * MiB:
            raise BenchError(f"{self.workdir}: {free / GiB:.1f} GiB free, need {(big_bytes + 256 * MiB) / GiB:.1f}")
        avail = int(next(line.split()[1] for line in open("/proc/meminfo") if line.startswith("MemAvailable"))) * 1024
        if avail < 5 * big_bytes:
            log(f"warning: {avail / GiB:.1f} GiB available memory; the source may not stay in page cache")
        self.mounts = MountManager(self.workdir)
        log(f"work directory {self.workdir}")
        self.build()
        if set(a.sections) - {"scale", "distributed"}:  # these make their own checkpoints
            self.make_checkpoints(big_bytes)

    def build(self) -> None:
        # As a pip install leaves it: byte-compiled (an editable install under PYTHONDONTWRITEBYTECODE would
        # compile every module at every start, ~50 ms of each mount here; ratarmount's and torch's are compiled).
        for root in {Path(self.args.ckptfs_root or REPO), *([Path(self.args.alt_root)] if self.args.alt_root else [])}:
            run([sys.executable, "-m", "compileall", "-q", str(root / "ckptfs")])
        bindir = self.workdir / "bin"
        bindir.mkdir(exist_ok=True)
        flags = run(["pkg-config", "--cflags", "--libs", "fuse3"], capture_output=True, text=True).stdout.split()
        for name, libs in (("passthrough", flags), ("listing", flags), ("preadbench", [])):
            out = str(bindir / name)
            run(["gcc", "-O2", "-Wall", str(LIB / f"{name}.c"), *libs, "-o", out])
            self.bin[name] = out

    def make_checkpoints(self, big_bytes: int) -> None:
        manifest_path = self.workdir / "checkpoints.json"
        want = {"big_bytes": big_bytes, "tensors": self.n_many, "version": 1}
        self.big = str(self.workdir / "big.pt")
        self.many = str(self.workdir / "many.pt")
        self.legacy = str(self.workdir / "many_legacy.pt")
        manifest = None
        with contextlib.suppress(OSError, ValueError):
            manifest = json.loads(manifest_path.read_text())
        if manifest and manifest.get("want") == want and all(map(os.path.exists, (self.big, self.many, self.legacy))):
            log("reusing checkpoints from an earlier --keep run")
            self.big_sum = manifest["big_sum"]
        else:
            t0 = time.perf_counter()
            self.torch = self.torch or TorchWorker()
            log(f"creating checkpoints with torch {self.torch.hello['torch']}: {big_bytes / MiB:.0f} MiB float32 "
                f"tensor, {self.n_many} small tensors (zip and legacy)")
            self.big_sum = self.torch.call(op="make_big", path=self.big, nbytes=big_bytes)["sum"]
            self.torch.call(op="make_many", path=self.many, count=self.n_many, legacy=False)
            self.torch.call(op="make_many", path=self.legacy, count=self.n_many, legacy=True)
            manifest_path.write_text(json.dumps({"want": want, "big_sum": self.big_sum}))
            log(f"checkpoints ready in {time.perf_counter() - t0:.1f} s")
        self.big_off, self.big_len = zip_record_span(self.big, "/data/0")
        self.res.meta["checkpoints"] = {
            "big": {"path": self.big, "size": os.path.getsize(self.big), "tensor_offset": self.big_off,
                    "tensor_bytes": self.big_len},
            "many": {"path": self.many, "size": os.path.getsize(self.many), "tensors": self.n_many},
            "many_legacy": {"path": self.legacy, "size": os.path.getsize(self.legacy), "tensors": self.n_many},
        }

    # ---- mounting the sides

    def ckptfs_argv(self, src: str, mnt: str, alt: bool = False,
                    extra: tuple[str, ...] = ()) -> tuple[list[str], dict[str, str]]:
        env = dict(os.environ)
        root = self.args.alt_root if alt else self.args.ckptfs_root
        if root:
            env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
            # -P: without it, -m puts the working directory (the repository) before PYTHONPATH.
            argv = [sys.executable, "-P", "-m", "ckptfs.cli"]
        else:
            exe = VENV_BIN / "ckptfs"
            argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "ckptfs.cli"]
        argv += ["mount", src, mnt, *(["-f"] if self.args.mount_mode == "foreground" else []),
                 *self.args.ckptfs_arg, *extra]
        env["XDG_CACHE_HOME"] = NO_CACHE_HOME  # every mount parses; section "cache" passes --cache-dir
        for kv in self.args.ckptfs_env + (self.args.alt_env if alt else []):
            k, _, v = kv.partition("=")
            env[k] = v
        return argv, env

    def mount_ckptfs(self, src: str, tag: str, alt: bool = False, extra: tuple[str, ...] = ()) -> Mount:
        assert self.mounts is not None
        argv, env = self.ckptfs_argv(src, str(self.workdir / "mnt" / tag), alt, extra)
        m = self.mounts.start(tag, argv, str(self.workdir / "mnt" / tag), env=env,
                              daemon=self.args.mount_mode == "daemon")
        if self.args.ckptfs_read_ahead_kb:  # an experiment: overrides what ckptfs set
            bdi_read_ahead_path(m.mnt).write_text(str(self.args.ckptfs_read_ahead_kb))
        return m

    def mount_cpass(self) -> Mount:
        assert self.mounts is not None
        mnt = str(self.workdir / "mnt" / "cpass")
        argv = [self.bin["passthrough"], self.big, str(self.big_off), str(self.big_len), "tensor",
                self.args.cpass_mode, mnt, "-f", "-o", f"ro,max_read={MiB},fsname=cpass"]
        if self.args.cpass_threads == "single":
            argv.append("-s")
        m = self.mounts.start("cpass", argv, mnt)
        path = bdi_read_ahead_path(mnt)
        try:
            path.write_text(str(self.args.read_ahead_kb))
        except OSError as exc:
            log(f"could not raise {path} to {self.args.read_ahead_kb} (root needed): {exc}")
        return m

    def mount_clist(self, listing: Path, tag: str) -> Mount:
        """The C listing file system (``listing.c``) showing the root entries ckptfs showed."""
        assert self.mounts is not None
        mnt = str(self.workdir / "mnt" / tag)
        argv = [self.bin["listing"], str(listing), mnt, "-f", "-s", "-o", "ro,fsname=clist"]
        return self.mounts.start(tag, argv, mnt)

    def mount_ratar(self, src: str, tag: str) -> Mount:
        assert self.mounts is not None
        mnt = str(self.workdir / "mnt" / tag)
        argv = [self.ratarmount_exe(), "-f", "--index-file", ":memory:", src, mnt]
        return self.mounts.start(tag, argv, mnt)

    def ratarmount_exe(self) -> str:
        exe = VENV_BIN / "ratarmount"
        return str(exe) if exe.exists() else (shutil.which("ratarmount") or "")

    # ---- sections

    def run_big(self) -> None:
        a = self.args
        assert self.mounts is not None
        warm(self.big, self.big_off, self.big_len)
        sides: dict[str, dict[str, Any]] = {"raw": {"path": self.big, "base": self.big_off, "mount": None}}
        made: list[Mount] = []
        try:
            m = self.mount_cpass()
            made.append(m)
            sides["cpass"] = {"path": os.path.join(m.mnt, "tensor"), "base": 0, "mount": m}
            if self.have_ckptfs:
                m = self.mount_ckptfs(self.big, "ckptfs-big")
                made.append(m)
                sides["ckptfs"] = {"path": find_file_of_size(m.mnt, self.big_len), "base": 0, "mount": m}
                self.res.meta["ckptfs_big_mount_s"] = m.ready_s
            if self.have_alt:
                m = self.mount_ckptfs(self.big, "alt-big", alt=True)
                made.append(m)
                sides["alt"] = {"path": find_file_of_size(m.mnt, self.big_len), "base": 0, "mount": m}
            if a.ratarmount:
                m = self.mount_ratar(self.big, "ratar-big")
                made.append(m)
                sides["ratar"] = {"path": find_file_of_size(m.mnt, self.big_len), "base": 0, "mount": m}
            for s in sides.values():
                if s["mount"] is not None:
                    same_bytes(self.big, self.big_off, s["path"], 0, self.big_len)
                    s["read_ahead_kb"] = read_ahead_kb(s["mount"].mnt)
            self.res.meta["sides"] = {
                n: {"path": s["path"], "read_ahead_kb": s.get("read_ahead_kb"),
                    "daemon_pid": s["mount"].pid if s["mount"] else None,
                    "daemon_threads": (proc_stat(s["mount"].pid).threads
                                       if s["mount"] and proc_stat(s["mount"].pid) else None)}
                for n, s in sides.items()}
            log("sides: " + ", ".join(f"{n}={s['path']} (read_ahead_kb={s.get('read_ahead_kb')})"
                                      for n, s in sides.items()))
            if "seq" in a.sections:
                self.section_seq(sides)
            if "memmap" in a.sections:
                self.section_memmap(sides)
            if "rand" in a.sections:
                self.section_rand(sides)
            for name, s in sides.items():
                if s["mount"] is not None:
                    hwm = proc_status_kib(s["mount"].pid, "VmHWM")
                    if hwm is not None:
                        self.res.fig("rss_big", f"daemon peak RSS, {self.big_len / MiB:.0f} MiB tensor mount",
                                     "MiB").add(name, hwm / 1024)
        finally:
            for m in reversed(made):
                self.mounts.stop(m)

    def _drop(self, s: dict[str, Any]) -> None:
        if s["mount"] is not None:
            drop_cache(s["path"])

    def section_seq(self, sides: dict[str, dict[str, Any]]) -> None:
        a = self.args
        gb = self.big_len / 1e9
        resid_after_drop: dict[str, float] = {}
        hidden: set[str] = set()
        daemon: dict[str, dict[str, list[float]]] = {}
        for run_i in range(a.runs):
            log(f"sequential reads, run {run_i + 1}/{a.runs}")
            for tool in SEQ_TOOLS:
                first = self.res.fig(f"seq_first_{tool}", f"first read, {tool.replace('_', ' ')}", "GB/s")
                again = self.res.fig(f"reread_{tool}", f"re-read (page cache), {tool.replace('_', ' ')}", "GB/s")
                for name, s in sides.items():
                    self._drop(s)
                    if s["mount"] is not None:
                        r = resident(s["path"])
                        if r is None:
                            hidden.add(name)
                        else:
                            resid_after_drop[name] = max(resid_after_drop.get(name, 0.0), r)
                    before = proc_stat(s["mount"].pid) if s["mount"] else None
                    t = self._seq_once(tool, s)
                    after = proc_stat(s["mount"].pid) if s["mount"] else None
                    first.add(name, gb / t)
                    if before and after:
                        d = daemon.setdefault(name, {"minflt_per_GiB": [], "cpu_s_per_GiB": []})
                        d["minflt_per_GiB"].append((after.minflt - before.minflt) / (self.big_len / GiB))
                        d["cpu_s_per_GiB"].append((after.cpu_s - before.cpu_s) / (self.big_len / GiB))
                    again.add(name, gb / self._seq_once(tool, s))
        self.res.meta["resident_after_drop_max"] = resid_after_drop
        self.res.meta["source_resident"] = resident(self.big, self.big_off, self.big_len)
        self.res.meta["daemon_first_read"] = {
            n: {k: statistics.median(v) for k, v in d.items()} for n, d in daemon.items()}
        if any(v > 0.01 for v in resid_after_drop.values()):
            log(f"warning: page cache not fully dropped: {resid_after_drop}")
        if hidden:
            log(f"warning: the kernel hides the page cache of {sorted(hidden)} from this user (not their owner): "
                "whether the drop emptied it is unknown")

    def _seq_once(self, tool: str, s: dict[str, Any]) -> float:
        path, base = s["path"], s["base"]
        raw = s["mount"] is None
        if tool.startswith("dd_"):
            bs = tool[3:]
            argv = ["dd", f"if={path}", "of=/dev/null", f"bs={bs}", "status=none"]
            if raw:
                argv += ["iflag=skip_bytes,count_bytes", f"skip={base}", f"count={self.big_len}"]
            return timed(argv)
        if raw:  # cat from a descriptor positioned at the range (reads the few KiB of zip trailer too)
            fd = os.open(path, os.O_RDONLY)
            try:
                os.lseek(fd, base, os.SEEK_SET)
                return timed(["cat"], stdin=fd)
            finally:
                os.close(fd)
        return timed(["cat", path])

    def _memmap_sum(self, s: dict[str, Any]) -> tuple[float, float]:
        n = self.big_len // 4
        t0 = time.perf_counter()
        arr = np.memmap(s["path"], dtype="<f4", mode="r", offset=s["base"], shape=(n,))
        total = float(arr.sum())
        dt = time.perf_counter() - t0
        del arr
        gc.collect()
        return dt, total

    def section_memmap(self, sides: dict[str, dict[str, Any]]) -> None:
        a = self.args
        gb = self.big_len / 1e9
        sums: dict[str, set[float]] = {}
        for run_i in range(a.runs):
            log(f"np.memmap sums, run {run_i + 1}/{a.runs}")
            f1 = self.res.fig("memmap_first", "np.memmap .sum(), first", "GB/s")
            f2 = self.res.fig("memmap_second", "np.memmap .sum(), second", "GB/s")
            for name, s in sides.items():
                self._drop(s)
                t, total = self._memmap_sum(s)
                f1.add(name, gb / t)
                sums.setdefault(name, set()).add(total)
                t, total = self._memmap_sum(s)
                f2.add(name, gb / t)
                sums.setdefault(name, set()).add(total)
        distinct = {v for vals in sums.values() for v in vals}
        if len(distinct) != 1:
            raise BenchError(f"memmap sums differ between sides: {sums}")

    def section_rand(self, sides: dict[str, dict[str, Any]]) -> None:
        a = self.args
        fig = self.res.fig("rand4k", "random 4 KiB pread, first read, mean latency", "us")
        detail: dict[str, list[dict[str, float]]] = {}
        for run_i in range(a.runs):
            log(f"random 4 KiB preads, run {run_i + 1}/{a.runs}")
            for name, s in sides.items():
                self._drop(s)
                count = a.preads
                if name == "ratar":
                    # ratarmount seeks in a zip member by reading from its start: a random read takes ~0.1-0.5 s
                    # on 1 GiB. Probe, then read as many as fit in about 15 s.
                    probe = self._preads(s, 8, run_i + 101)
                    count = max(8, min(a.preads, int(15e6 / max(probe["mean_us"], 1.0))))
                    self._drop(s)
                stats = self._preads(s, count, run_i + 1)
                fig.add(name, stats["mean_us"])
                detail.setdefault(name, []).append(stats)
        fig.extra = {n: {k: statistics.median(d[k] for d in v) for k in ("count", "p50_us", "p90_us", "p99_us",
                                                                           "max_us")}
                     for n, v in detail.items()}

    def _preads(self, s: dict[str, Any], count: int, seed: int) -> dict[str, float]:
        out = run([self.bin["preadbench"], s["path"], str(s["base"]), str(self.big_len), str(count), "4096",
                   str(seed)], capture_output=True, text=True).stdout
        return json.loads(out)

    def run_many(self) -> None:
        a = self.args
        assert self.mounts is not None
        for p in (self.many, self.legacy):
            warm(p, 0, os.path.getsize(p))
        if self.torch is None:
            self.torch = TorchWorker()
        self.res.meta["torch_import_s"] = self.torch.hello["import_s"]
        entries: dict[str, int] = {}
        root_entries: dict[str, int] = {}
        for run_i in range(a.runs):
            log(f"{self.n_many}-tensor mounts, run {run_i + 1}/{a.runs}")
            # The fixed cost of a mount (start-up, imports, fork, FUSE init): the one-tensor checkpoint.
            one = self.res.fig("mount_one", "mount ready, 1 tensor (fixed cost)", "s")
            for side in (["ckptfs"] if self.have_ckptfs else []) + (["alt"] if self.have_alt else []):
                m = self.mount_ckptfs(self.big, f"{side}-one", alt=side == "alt")
                try:
                    one.add(side, m.ready_s)
                finally:
                    self.mounts.stop(m)
            for fmt, src in (("zip", self.many), ("legacy", self.legacy)):
                ready = self.res.fig(f"mount_{fmt}", f"mount ready, {self.n_many} tensors, {fmt}", "s")
                find = self.res.fig(f"find_{fmt}", f"find -ls, {self.n_many} tensors, {fmt}", "s")
                rss = self.res.fig(f"rss_{fmt}", f"daemon peak RSS, {self.n_many} tensors, {fmt}", "MiB")
                listing = self.workdir / f"root-entries-{fmt}.txt"
                # The floor of a Python mount: a Python process reading the pickle with the C unpickler, and
                # the C file system listing the same root.
                ready.add("cpickle", timed([sys.executable, str(LIB / "pickle_floor.py"), src]))
                sides = ((["ckptfs"] if self.have_ckptfs else []) + (["alt"] if self.have_alt else [])
                         + (["ratar"] if a.ratarmount and fmt == "zip" else [])
                         + (["clist"] if self.have_ckptfs else []))
                for side in sides:
                    tag = f"{side}-{fmt}"
                    if side == "ratar":
                        m = self.mount_ratar(src, tag)
                    elif side == "clist":
                        m = self.mount_clist(listing, tag)
                    else:
                        m = self.mount_ckptfs(src, tag, alt=side == "alt")
                    try:
                        ready.add(side, m.ready_s)
                        if side == "clist":
                            ready.add("floor", ready.values["cpickle"][-1] + m.ready_s)
                        find.add(side, timed(["find", m.mnt, "-ls"]))
                        if run_i == 0:
                            out = subprocess.run(["find", m.mnt, "-type", "f"], capture_output=True, check=True)
                            entries[tag] = out.stdout.count(b"\n")
                            if side == "ckptfs":
                                root_entries[fmt] = write_root_entries(m.mnt, listing)
                        hwm = proc_status_kib(m.pid, "VmHWM")
                        if hwm is not None:
                            rss.add(side, hwm / 1024)
                    finally:
                        self.mounts.stop(m)
                ready.add("torch", self.torch.call(op="load", path=src, mmap=(fmt == "zip"))["seconds"])
        self.res.meta["files_listed"] = entries
        self.res.meta["clist_root_entries"] = root_entries
        for tag, n in entries.items():
            if tag.startswith("ckptfs") and n < self.n_many:
                log(f"warning: {tag} lists {n} files for {self.n_many} tensors")

    # ---- checks and the whole run

    def define_checks(self) -> None:
        c = self.res.checks
        for tool in SEQ_TOOLS:
            f = f"seq_first_{tool}"
            c.append(Check(f, "ckptfs", "cpass", ">=", 0.9, f"first read {tool}: ckptfs / C pass-through"))
            c.append(Check(f, "ckptfs", "ratar", ">=", 2.5, f"first read {tool}: ckptfs / ratarmount"))
            c.append(Check(f, "ckptfs", "raw", ">=", None, f"first read {tool}: ckptfs / raw"))
            c.append(Check(f, "cpass", "raw", ">=", None, f"first read {tool}: C pass-through / raw"))
        for tool in SEQ_TOOLS:
            f = f"reread_{tool}"
            c.append(Check(f, "ckptfs", "raw", ">=", 0.45, f"re-read {tool}: ckptfs / raw"))
            c.append(Check(f, "cpass", "raw", ">=", None, f"re-read {tool}: C pass-through / raw"))
        c.append(Check("memmap_first", "ckptfs", "raw", ">=", 0.35, "memmap sum first: ckptfs / raw"))
        c.append(Check("memmap_first", "cpass", "raw", ">=", None, "memmap sum first: C pass-through / raw"))
        c.append(Check("memmap_second", "ckptfs", "raw", ">=", 0.7, "memmap sum second: ckptfs / raw"))
        c.append(Check("memmap_second", "cpass", "raw", ">=", None, "memmap sum second: C pass-through / raw"))
        c.append(Check("rand4k", "ckptfs", "raw", "<=", 25, "random 4 KiB pread latency: ckptfs / raw"))
        c.append(Check("rand4k", "cpass", "raw", "<=", None, "random 4 KiB pread latency: C pass-through / raw"))
        for fmt in ("zip", "legacy"):
            if fmt == "zip":
                c.append(Check("mount_one", "ckptfs", None, "<=", None, "mount ready (1 tensor), seconds"))
            c.append(Check(f"mount_{fmt}", "ckptfs", None, "<=", 0.4, f"mount ready ({fmt}), seconds"))
            c.append(Check(f"mount_{fmt}", "ckptfs", "torch", "<=", 0.15, f"mount ready ({fmt}) / torch.load+listing"))
            c.append(Check(f"mount_{fmt}", "ckptfs", "ratar", "<=", None, f"mount ready ({fmt}) / ratarmount"))
            c.append(Check(f"find_{fmt}", "ckptfs", None, "<=", 0.3, f"find -ls ({fmt}), seconds"))
            c.append(Check(f"find_{fmt}", "ckptfs", "ratar", "<=", None, f"find -ls ({fmt}) / ratarmount"))
            c.append(Check(f"mount_{fmt}", "ckptfs", "clist", "<=", None,
                           f"mount ready ({fmt}) / C listing of the same root"))
            c.append(Check(f"mount_{fmt}", "floor", None, "<=", None,
                           f"floor of a Python mount ({fmt}): C unpickler process + C listing, seconds"))
            c.append(Check(f"mount_{fmt}", "ckptfs", "floor", "<=", None, f"mount ready ({fmt}) / that floor"))
            c.append(Check(f"find_{fmt}", "ckptfs", "clist", "<=", None, f"find -ls ({fmt}) / C listing of the same root"))
            c.append(Check(f"rss_{fmt}", "ckptfs", None, "<=", 80, f"daemon peak RSS ({fmt}), MiB"))
        c.append(Check("rss_big", "ckptfs", None, "<=", None, "daemon peak RSS (big tensor), MiB"))
        if "views" in self.args.sections:
            views.define_checks(self, Check)
        if "scale" in self.args.sections:
            scale.define_checks(self, sys.modules[__name__])
        if self.have_alt:
            for key in [f"seq_first_{t}" for t in SEQ_TOOLS] + [f"reread_{t}" for t in SEQ_TOOLS] + [
                    "memmap_first", "memmap_second", "rand4k", "rss_big"] + [
                    f"{k}_{fmt}" for fmt in ("zip", "legacy") for k in ("mount", "find", "rss")] + ["mount_one"]:
                c.append(Check(key, "alt", "ckptfs", ">=", None, f"A/B {key}: alt / ckptfs"))

    def collect_meta(self) -> None:
        m = self.res.meta
        m["command"] = shlex.join(["scripts/bench", *sys.argv[1:]])
        m["runs"] = self.args.runs
        m["quick"] = self.args.quick
        m["time"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        m["kernel"] = platform.release()
        m["cpus"] = os.cpu_count()
        with contextlib.suppress(OSError, StopIteration):
            m["cpu_model"] = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                                  if line.startswith("model name"))
        with contextlib.suppress(Exception):
            m["libfuse3"] = run(["pkg-config", "--modversion", "fuse3"], capture_output=True, text=True).stdout.strip()
        with contextlib.suppress(Exception):
            rev = run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
            dirty = run(["git", "-C", str(REPO), "status", "--porcelain", "--", "ckptfs"], capture_output=True,
                        text=True).stdout.strip()
            m["ckptfs_git"] = rev.stdout.strip() + ("+dirty" if dirty else "")
        pkg = Path(self.args.ckptfs_root or REPO) / "ckptfs"
        digest = hashlib.sha256()
        for f in sorted(pkg.rglob("*.py")):
            digest.update(str(f.relative_to(pkg)).encode() + b"\0" + f.read_bytes())
        m["ckptfs_source_sha256"] = digest.hexdigest()[:16]
        m["cpass"] = {"mode": self.args.cpass_mode, "threads": self.args.cpass_threads,
                      "read_ahead_kb": self.args.read_ahead_kb}
        m["ckptfs_cmd"] = shlex.join(self.ckptfs_argv("SRC", "MNT")[0])
        if self.args.ckptfs_env:
            m["ckptfs_env"] = self.args.ckptfs_env

    def main(self) -> int:
        a = self.args
        try:
            argv, env = self.ckptfs_argv("SRC", "MNT")
            probe = subprocess.run(argv[: argv.index("mount") + 1] + ["--help"], env=env, capture_output=True)
            if probe.returncode != 0:
                if not a.allow_no_ckptfs:
                    raise BenchError(f"{shlex.join(argv[:argv.index('mount') + 1])} --help failed: "
                                     f"{probe.stderr.decode(errors='replace')[-300:]}")
                log("ckptfs mount is not available: measuring the other sides only")
                self.have_ckptfs = False
            self.setup()
            self.collect_meta()
            self.define_checks()
            if a.ratarmount and not self.ratarmount_exe():
                log("ratarmount is not installed (try: .venv/bin/pip install ratarmount); running without it")
                a.ratarmount = False
                self.res.meta["ratarmount"] = "not installed"
            elif a.ratarmount:
                with contextlib.suppress(Exception):
                    self.res.meta["ratarmount"] = run([self.ratarmount_exe(), "--version"], capture_output=True,
                                                      text=True).stdout.splitlines()[0]
            self.res.meta["loadavg"] = {"start": loadavg()}
            if {"seq", "memmap", "rand"} & set(a.sections):
                self.run_big()
                self.res.meta["loadavg"]["after_big"] = loadavg()
            if "many" in a.sections:
                self.run_many()
            if "cache" in a.sections:
                run_cached(self, log)
            if "views" in a.sections:
                views.run(self, views.Tools(timed, drop_cache, resident, warm, log, BenchError))
            if "remote" in a.sections:
                import remote

                self.res.meta["remote_table"] = remote.run(self)
            if "scale" in a.sections:
                scale.run(self, sys.modules[__name__])
            if "distributed" in a.sections:
                import dask_cluster

                self.res.meta["distributed_table"] = dask_cluster.run(self, log)
            self.res.meta["loadavg"]["end"] = loadavg()
            if max(self.res.meta["loadavg"].values()) > 1.0:
                log(f"note: the machine was busy (load average {self.res.meta['loadavg']}); ratios stay comparable "
                    f"but absolute figures are lower")
            self.report()
            return 0
        except BaseException:
            if self.res.figures:
                log("stopped early; the figures measured so far:")
                self.res.meta["incomplete"] = True
                with contextlib.suppress(Exception):
                    self.report()
            raise
        finally:
            self.cleanup()

    def report(self) -> None:
        print(render_table(self.res), flush=True)
        for table in ("remote_table", "distributed_table"):
            if table in self.res.meta:
                print("\n" + self.res.meta[table], flush=True)
        if self.args.json:
            Path(self.args.json).write_text(json.dumps(self.res.to_json(), indent=1) + "\n")
            log(f"wrote {self.args.json}")

    def cleanup(self) -> None:
        if self.mounts is not None:
            self.mounts.stop_all()
        if self.torch is not None:
            self.torch.close()
        if not self.workdir or self.workdir == Path():
            return
        if self.args.keep:
            log(f"kept {self.workdir}")
            return
        if self.own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        else:
            for name in ("big.pt", "many.pt", "many_legacy.pt", "checkpoints.json", "root-entries-zip.txt",
                         "root-entries-legacy.txt", "root-entries-scale.txt",
                         *(p.name for p in self.workdir.glob("moe-*"))):
                with contextlib.suppress(OSError):
                    (self.workdir / name).unlink()
            for name in ("bin", "mnt", "views", "scale-cache", "metadata-cache"):
                shutil.rmtree(self.workdir / name, ignore_errors=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="scripts/bench",
        description="Benchmark ckptfs side by side with its limits: the raw .pt, a C libfuse3 pass-through, "
                    "torch.load and (optionally) ratarmount. Prints a table; --json writes every figure.")
    p.add_argument("--json", metavar="PATH", help="write all figures, per-run values and ratios as JSON")
    p.add_argument("--runs", type=int, default=5, help="runs per figure; medians are reported (default 5)")
    p.add_argument("--quick", action="store_true", help="smoke sizes: 64 MiB tensor, 2,000 tensors")
    p.add_argument("--ratarmount", action="store_true", help="also measure ratarmount on the same files")
    p.add_argument("--workdir", metavar="DIR", help="where checkpoints and mounts go (default: a new /var/tmp dir)")
    p.add_argument("--keep", action="store_true", help="keep the work directory (a later --workdir run reuses it)")
    p.add_argument("--sections", default=",".join(SECTIONS),
                   help=f"comma-separated subset of {','.join(SECTIONS + OPTIONAL_SECTIONS)} (default: "
                        f"{','.join(SECTIONS)})")
    p.add_argument("--views", action="store_true",
                   help="also measure the views (model.safetensors, .npy, /.zarr) and ckptfs diff/convert "
                        "(section 'views'; see scripts/bench_lib/views.py)")
    p.add_argument("--scale", action="store_true",
                   help="add the scale section: 200,000 MoE-named tensors (--quick: 20,000), torch side by side")
    p.add_argument("--scale-tensors", type=int, metavar="N", help="tensors in the scale section's checkpoint")
    p.add_argument("--big-mib", type=int, help="size of the big tensor in MiB (default 1024; --quick 64)")
    p.add_argument("--tensors", type=int, help="tensors in the many-tensor checkpoint (default 20000; --quick 2000)")
    p.add_argument("--preads", type=int, default=20000, help="random 4 KiB preads per run (default 20000)")
    p.add_argument("--cpass-mode", choices=("buf", "read"), default="buf",
                   help="C pass-through answers with read_buf (fd buffer, default) or pread")
    p.add_argument("--cpass-threads", choices=("single", "multi"), default="single",
                   help="C pass-through event loop (default single: streams fastest)")
    p.add_argument("--read-ahead-kb", type=int, default=1024, help="read_ahead_kb set on the C pass-through mount")
    p.add_argument("--alt-root", metavar="DIR",
                   help="A/B: also measure ckptfs from this source tree (DIR/ckptfs) as side 'alt', pair by pair")
    p.add_argument("--alt-env", action="append", default=[], metavar="K=V",
                   help="A/B: environment for the 'alt' side only (with or without --alt-root)")
    p.add_argument("--ckptfs-read-ahead-kb", type=int, metavar="KB",
                   help="experiment: set this read_ahead_kb on ckptfs mounts after they start")
    p.add_argument("--ckptfs-root", metavar="DIR", help="run ckptfs from this source tree (PYTHONPATH) instead")
    p.add_argument("--mount-mode", choices=("daemon", "foreground"), default="daemon",
                   help="time 'ckptfs mount' until it returns (daemon, default) or run it with -f and poll "
                        "until the mount answers (foreground)")
    p.add_argument("--ckptfs-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for ckptfs mount (repeatable)")
    p.add_argument("--ckptfs-env", action="append", default=[], metavar="K=V",
                   help="environment variable for the ckptfs daemon (repeatable)")
    p.add_argument("--remote", action="store_true",
                   help="add the remote section: the checkpoints as s3:// URLs over nginx and radosgw on loopback, "
                        "against S3 clients (remote.py; --sections remote for this alone)")
    p.add_argument("--distributed", action="store_true",
                   help="add the distributed section: ckpt:// on a Dask LocalCluster against moto behind nginx "
                        "(dask_cluster.py; --sections distributed for this alone)")
    p.add_argument("--allow-no-ckptfs", action="store_true",
                   help="if ckptfs mount is unavailable, still measure the limits (raw, C, torch, ratarmount)")
    a = p.parse_args(argv)
    a.sections = [s.strip() for s in a.sections.split(",") if s.strip()]
    a.sections += [name for name in OPTIONAL_SECTIONS if getattr(a, name) and name not in a.sections]
    bad = set(a.sections) - set(SECTIONS) - set(OPTIONAL_SECTIONS)
    if bad:
        p.error(f"unknown sections: {', '.join(sorted(bad))}")
    if a.runs < 1:
        p.error("--runs must be at least 1")
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def on_signal(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored (nohup, &)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    try:
        return Bench(args).main()
    except BenchError as exc:
        log(f"error: {exc}")
        return 1
    except KeyboardInterrupt:
        log("interrupted; mounts removed")
        return 130


if __name__ == "__main__":
    sys.exit(main())
