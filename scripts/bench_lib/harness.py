"""The run every section shares: its work directory, checkpoints, C helpers, mounts of each side, and report.

The sections (``sections.py``) receive the ``Bench`` and add their figures and checks to ``bench.res``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from common import (GiB, LIB, MiB, REPO, VENV_BIN, BenchError, bdi_read_ahead_path, loadavg, log, run,
                    zip_record_span)
from metadata_cache import NO_CACHE_HOME
from mounts import Mount, MountManager
from results import Results, render_table
from torch_client import TorchWorker


@dataclass(frozen=True)
class Section:
    """A part of the benchmark: the ``--sections`` names it answers to, what it measures, its checks."""

    names: tuple[str, ...]
    run: Callable[[Bench], None]
    define_checks: Callable[[Bench], None] | None = None
    default: bool = True
    """Run without ``--sections``; the others by name or by their own flag (``--views``, ``--scale``, ...)."""
    own_checkpoint: bool = False
    """Makes the checkpoints it measures; the shared big and many-tensor ones are made only for the others."""


class Bench:

    def __init__(self, args: argparse.Namespace, sections: Sequence[Section]) -> None:
        self.args = args
        self.sections = [s for s in sections if set(s.names) & set(args.sections)]
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
        self.started = time.time()
        """A ``--workdir``'s checkpoints written before this (an earlier ``--keep`` run's) are not removed."""

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
        if any(not section.own_checkpoint for section in self.sections):
            self.make_checkpoints(big_bytes)

    def build(self) -> None:
        # As a pip install leaves it: byte-compiled (an editable install under PYTHONDONTWRITEBYTECODE would
        # compile every module at every start, ~50 ms of each mount here; ratarmount's and torch's are compiled).
        for root in {Path(self.args.ckptfs_root or REPO), *([Path(self.args.alt_root)] if self.args.alt_root else [])}:
            run([sys.executable, "-m", "compileall", "-q", str(root / "ckptfs")])
        bindir = self.workdir / "bin"
        bindir.mkdir(exist_ok=True)
        flags = run(["pkg-config", "--cflags", "--libs", "fuse3"], capture_output=True, text=True).stdout.split()
        for name, libs in (("passthrough", flags), ("listing", flags), ("listing_ll", flags), ("preadbench", [])):
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

    def mount_clist(self, listing: Path, tag: str, low_level: bool = False) -> Mount:
        """The C listing file system (``listing.c``; ``low_level``: ``listing_ll.c``, on libfuse's low-level API)
        showing the root entries ckptfs showed."""
        assert self.mounts is not None
        mnt = str(self.workdir / "mnt" / tag)
        program = "listing_ll" if low_level else "listing"
        argv = [self.bin[program], str(listing), mnt, "-f", "-s", "-o", f"ro,fsname={program}"]
        return self.mounts.start(tag, argv, mnt)

    def mount_ratar(self, src: str, tag: str) -> Mount:
        assert self.mounts is not None
        mnt = str(self.workdir / "mnt" / tag)
        argv = [self.ratarmount_exe(), "-f", "--index-file", ":memory:", src, mnt]
        return self.mounts.start(tag, argv, mnt)

    def ratarmount_exe(self) -> str:
        exe = VENV_BIN / "ratarmount"
        return str(exe) if exe.exists() else (shutil.which("ratarmount") or "")

    def collect_meta(self) -> None:
        m = self.res.meta
        m["command"] = shlex.join(["scripts/bench", *sys.argv[1:]])
        m["runs"] = self.args.runs
        m["quick"] = self.args.quick
        m["time"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        m["kernel"] = platform.release()
        # Python-bound rows move ~15% with the interpreter's build (PGO/LTO or not): which one made the venv.
        m["python"] = {"executable": sys.executable, "version": platform.python_version(),
                       "config_args": sysconfig.get_config_var("CONFIG_ARGS") or ""}
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
            for section in self.sections:
                if section.define_checks is not None:
                    section.define_checks(self)
            if a.ratarmount and not self.ratarmount_exe():
                log("ratarmount is not installed (try: .venv/bin/pip install ratarmount); running without it")
                a.ratarmount = False
                self.res.meta["ratarmount"] = "not installed"
            elif a.ratarmount:
                with contextlib.suppress(Exception):
                    self.res.meta["ratarmount"] = run([self.ratarmount_exe(), "--version"], capture_output=True,
                                                      text=True).stdout.splitlines()[0]
            self.res.meta["loadavg"] = {"start": loadavg()}
            for section in self.sections:
                section.run(self)
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
        for name in sorted(self.res.meta):
            if name.endswith("_table"):  # a section's own table (remote, write-fill, ...)
                print("\n" + self.res.meta[name], flush=True)
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
                         *(p.name for p in self.workdir.glob("moe-*")),
                         *(p.name for p in self.workdir.glob("values-*") if p.is_file())):
                with contextlib.suppress(OSError):
                    if (self.workdir / name).stat().st_mtime >= self.started:
                        (self.workdir / name).unlink()
            for name in ("bin", "mnt", "views", "scale-cache", "metadata-cache",
                         *(p.name for p in self.workdir.glob("values-tree-*"))):
                shutil.rmtree(self.workdir / name, ignore_errors=True)
