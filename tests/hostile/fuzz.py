"""Mutation fuzzer of the reader: ``python -m hostile.fuzz`` (run from ``tests/``; ``scripts/fuzz`` does that).

Forked workers mutate real checkpoints (zip, legacy, TorchScript, re-zipped —
written by torch in a separate process — and the hand-made corpus cases that
open, DCP directories among them: their ``.metadata`` and ``.distcp`` files are
mutated, and they are read from memory) and put each input through
``fuzz_target.exercise``. A directory input is saved as a directory ``NAME.dcp/``. A worker runs under
RLIMIT_AS = 500 MiB. Outcomes other than success or a ``CkptfsError``:

* crash   — any other exception (saved as ``crash-*.pt`` with its traceback);
* memory  — a MemoryError: the input needed more than the memory bound;
* hang    — an input took 2 s of CPU time (or 30 s of wall time, for a stall): the worker is killed,
            the input saved (CPU time, so that a busy machine does not pass for a hang);
* died    — the worker process ended (a signal: segfault, kill).

A progress line shows inputs, rate and each count; ``--json`` prints a summary.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import mmap
import os
import random
import resource
import signal
import struct
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hostile.cases import CASES, Env, Link
from hostile.seeds import SEED_NAMES

Input = bytes | dict[str, bytes]

TIME_BOUND = 2.0
"""CPU seconds one input may take before its worker counts as hung (``--hang-seconds``): 2 s when fuzzing by
hand, to find slow inputs; the test suite gives a guard far above, as CPU time drifts with the machine's load."""
STALL = 30.0
MEMORY_BOUND = 500 << 20
SLOT = 2 << 20
"""Shared bytes per worker: a header and the input being exercised (larger inputs are cut when saved)."""
HEADER = struct.Struct("<QQQQ")
"""count, crashes, memory errors, length of the current input."""
DIRECTORY_MAGIC = b"\x00ckptfs-fuzz-directory\x00"
"""How a directory input starts in the shared slot: then, per file, its name's and data's lengths, name, data."""
MEMBER = struct.Struct("<HI")
MAX_HAND_MADE = 16384
"""Hand-made cases larger than this are left out of the seeds: they would slow every input made from them."""


@dataclass
class Summary:
    inputs: int = 0
    seconds: float = 0.0
    rate: float = 0.0
    workers: int = 0
    crashes: int = 0
    memory: int = 0
    hangs: int = 0
    died: int = 0
    max_rss: int = 0
    canary: bool = False
    seeds: int = 0
    saved: list[str] = field(default_factory=list)


class Worker:
    def __init__(self, index: int, shared: mmap.mmap, seeds: list[Input], out: Path, seed: int) -> None:
        self.shared = shared
        self.base = index * SLOT
        HEADER.pack_into(shared, self.base, 0, 0, 0, 0)
        self.pid = self._start(seeds, out, seed)
        self.last_count = 0
        self.last_progress = time.monotonic()
        self.last_cpu = 0.0

    def _start(self, seeds: list[Input], out: Path, seed: int) -> int:
        pid = os.fork()
        if pid == 0:
            try:
                _work(self.shared, self.base, seeds, out, seed)
            except BaseException:
                (out / f"worker-{os.getpid()}.txt").write_text(traceback.format_exc())
            os._exit(70)
        return pid

    def header(self) -> tuple[int, int, int, int]:
        return HEADER.unpack_from(self.shared, self.base)

    def current_input(self) -> Input:
        length = self.header()[3]
        start = self.base + HEADER.size
        return decode_input(bytes(self.shared[start : start + min(length, SLOT - HEADER.size)]))


def encode_input(data: Input) -> bytes:
    if isinstance(data, bytes):
        return data
    return DIRECTORY_MAGIC + b"".join(MEMBER.pack(len(name.encode()), len(content)) + name.encode() + content
                                      for name, content in data.items())


def decode_input(raw: bytes) -> Input:
    """The input ``encode_input`` stored; a directory cut short by the slot keeps its whole files (the rest
    are lost), and raw bytes that are not a directory stay bytes."""
    if not raw.startswith(DIRECTORY_MAGIC):
        return raw
    files, at = {}, len(DIRECTORY_MAGIC)
    while at + MEMBER.size <= len(raw):
        name_length, length = MEMBER.unpack_from(raw, at)
        at += MEMBER.size
        if at + name_length + length > len(raw):
            break
        files[raw[at : at + name_length].decode("utf-8", "replace")] = raw[at + name_length : at + name_length + length]
        at += name_length + length
    return files


def _work(shared: mmap.mmap, base: int, seeds: list[Input], out: Path, seed: int) -> None:
    from hostile.fuzz_target import Mutator, exercise

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BOUND, MEMORY_BOUND))
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    rng = random.Random(seed)
    mutate = Mutator(seeds, rng)
    count = crashes = memory = 0
    while True:
        data = mutate()
        encoded = encode_input(data)
        stored = encoded[: SLOT - HEADER.size]
        shared[base + HEADER.size : base + HEADER.size + len(stored)] = stored
        HEADER.pack_into(shared, base, count, crashes, memory, len(encoded))
        try:
            exercise(data, rng)
        except MemoryError:
            memory += 1
            _save(out, "memory", data, traceback.format_exc())
        except Exception:
            crashes += 1
            _save(out, "crash", data, traceback.format_exc())
        count += 1


def _save(out: Path, kind: str, data: Input, note: str) -> str:
    """The input as ``NAME.pt``, or as a directory ``NAME.dcp/``, and the note as ``NAME.txt``."""
    name = f"{kind}-{hashlib.sha1(encode_input(data)).hexdigest()[:16]}"
    if isinstance(data, bytes):
        (out / f"{name}.pt").write_bytes(data)
    else:
        directory = out / f"{name}.dcp"
        directory.mkdir(exist_ok=True)
        for member, content in data.items():
            (directory / os.path.basename(member)).write_bytes(content)
    (out / f"{name}.txt").write_text(note)
    return name


def load_seeds(seed_dir: Path, canary: Path) -> list[Input]:
    """The torch-written seeds (written by ``seeds.py`` in its own process if missing) and small hand-made cases,
    the DCP directories among them (without their links)."""
    if not all((seed_dir / name).exists() for name in SEED_NAMES):
        subprocess.run([sys.executable, str(Path(__file__).with_name("seeds.py")), str(seed_dir)], check=True)
    torch_seeds = {name: (seed_dir / name).read_bytes() for name in SEED_NAMES}
    env = Env(canary, torch_seeds)
    hand_made: list[Input] = []
    for case in CASES:
        if case.error is not None:
            continue
        data = case.build(env)
        if isinstance(data, dict):
            data = {name: content for name, content in data.items() if not isinstance(content, Link)}
        if len(encode_input(data)) <= MAX_HAND_MADE:  # type: ignore[arg-type]
            hand_made.append(data)  # type: ignore[arg-type]
    return [*torch_seeds.values(), *hand_made]


def fuzz(seeds: list[Input], out: Path, seconds: float, max_inputs: int | None, workers: int, seed: int,
         progress: bool, hang_seconds: float = TIME_BOUND) -> Summary:
    shared = mmap.mmap(-1, SLOT * workers)
    summary = Summary(workers=workers, seeds=len(seeds))
    retired = [0, 0, 0]
    """Inputs, crashes and memory errors of workers that were replaced."""
    restarts = 0
    pool = [Worker(i, shared, seeds, out, seed + i) for i in range(workers)]
    start = last_line = time.monotonic()
    try:
        while True:
            time.sleep(0.05)
            now = time.monotonic()
            for i, worker in enumerate(pool):
                count = worker.header()[0]
                cpu = _cpu_seconds(worker.pid)
                if count != worker.last_count:
                    worker.last_count, worker.last_progress, worker.last_cpu = count, now, cpu
                waited, status, usage = os.wait4(worker.pid, os.WNOHANG)
                hung = not waited and (cpu - worker.last_cpu > hang_seconds or now - worker.last_progress > STALL)
                if not waited and not hung:
                    continue
                if hung:
                    os.kill(worker.pid, signal.SIGKILL)
                    _, status, usage = os.wait4(worker.pid, 0)
                    summary.hangs += 1
                    _save(out, "hang", worker.current_input(), f"{cpu - worker.last_cpu:.1f} s of CPU, "
                                                                        f"{now - worker.last_progress:.1f} s")
                else:
                    summary.died += 1
                    _save(out, "died", worker.current_input(), f"wait status {status}")
                summary.max_rss = max(summary.max_rss, usage.ru_maxrss * 1024)
                retired = [a + b for a, b in zip(retired, worker.header()[:3])]
                restarts += 1
                pool[i] = Worker(i, shared, seeds, out, seed + 1000 * restarts + i)
            inputs, crashes, memory = _totals(retired, pool)
            elapsed = now - start
            if progress and now - last_line >= 1:
                last_line = now
                _progress(elapsed, inputs, crashes, memory, summary)
            if elapsed >= seconds or (max_inputs is not None and inputs >= max_inputs):
                break
    finally:
        for worker in pool:
            os.kill(worker.pid, signal.SIGKILL)
            _, _, usage = os.wait4(worker.pid, 0)
            summary.max_rss = max(summary.max_rss, usage.ru_maxrss * 1024)
    summary.inputs, summary.crashes, summary.memory = _totals(retired, pool)
    summary.seconds = time.monotonic() - start
    summary.rate = summary.inputs / summary.seconds
    summary.saved = sorted(p.stem for pattern in ("*.pt", "*.dcp") for p in out.glob(pattern))
    if progress:
        _progress(summary.seconds, summary.inputs, summary.crashes, summary.memory, summary)
        sys.stderr.write("\n")
    return summary


def _cpu_seconds(pid: int) -> float:
    """User and system time of a process so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _totals(retired: list[int], pool: list[Worker]) -> tuple[int, int, int]:
    inputs, crashes, memory = retired
    for worker in pool:
        count, worker_crashes, worker_memory, _ = worker.header()
        inputs, crashes, memory = inputs + count, crashes + worker_crashes, memory + worker_memory
    return inputs, crashes, memory


def _progress(elapsed: float, inputs: int, crashes: int, memory: int, summary: Summary) -> None:
    sys.stderr.write(f"\r[{elapsed:7.1f}s] {inputs:>11,} inputs {inputs / max(elapsed, 1e-9):>7,.0f}/s  "
                     f"crashes {crashes}  memory {memory}  hangs {summary.hangs}  died {summary.died}  ")
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="stop after this long (default 60)")
    parser.add_argument("--inputs", type=int, help="stop after this many inputs")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, default=int(time.time()), help="random seed (reruns are exact per worker)")
    parser.add_argument("--out", type=Path, default=Path("fuzz-out"), help="where crashers are saved")
    parser.add_argument("--seeds", type=Path, default=Path(".fuzz-seeds"), help="torch-written seed checkpoints")
    parser.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    parser.add_argument("--hang-seconds", type=float, default=TIME_BOUND,
                        help=f"CPU seconds one input may take before it counts as a hang (default {TIME_BOUND})")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the workers are stopped too
    args.out.mkdir(parents=True, exist_ok=True)
    canary = args.out / "canary"
    seeds = load_seeds(args.seeds, canary)
    sys.stderr.write(f"fuzz: {len(seeds)} seeds, {args.workers} workers, seed {args.seed}, crashers in {args.out}\n")
    summary = fuzz(seeds, args.out, args.seconds if args.inputs is None else float("inf"), args.inputs,
                   args.workers, args.seed, progress=True, hang_seconds=args.hang_seconds)
    summary.canary = canary.exists()
    if args.json:
        print(json.dumps(asdict(summary)))
    bad = summary.crashes or summary.memory or summary.hangs or summary.died or summary.canary
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
