"""The mounts a run makes (every side's daemon in its own session), each unmounted at the end, on failure too."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from common import BenchError, fuse_daemon_pids, log, mountpoints


@dataclass
class Mount:
    name: str
    mnt: str
    proc: subprocess.Popen
    log_path: str
    daemon: bool = False
    ready_s: float = 0.0
    """Seconds until the mount is usable: the command returned (daemon) or the mount appeared, and its root listed."""
    returned_s: float = 0.0
    """Seconds until the mount command returned (daemon mode) or the mount appeared (foreground), not yet listed."""
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
            m.returned_s = time.perf_counter() - t0
            os.listdir(mnt)
            m.ready_s = time.perf_counter() - t0
            if mnt not in mountpoints():
                raise BenchError(f"{name}: {shlex.join(argv)} returned but {mnt} is not mounted")
        while not daemon:
            if mnt in mountpoints():
                m.returned_s = time.perf_counter() - t0
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


