"""Fixtures of the hostile suite: the generated corpus, real seeds, a bounded CLI runner, the canary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
from mount.helpers import require_fuse

from ckptfs.limits import Limits
from hostile.cases import CASES, Env, write_case
from hostile.mounting import Mounts
from hostile.seeds import SEED_NAMES, write_seeds

HERE = Path(__file__).resolve().parent
HANG_SECONDS = 60.0
"""Wall seconds after which a case counts as hung: a guard against hangs only, far above what any case costs
(at most 2 s of CPU end to end; 12 s of wall time on a busy 2-core machine). Time, even CPU time, moves with the
machine's load (a case measured at 2.08 s of CPU against a bound of 2.0): how much work a case may do is bounded
by counts that do not drift instead, the bytes a run reads and writes (READ_BOUND, WRITE_BOUND), the entries and
index bytes a mount makes (in test_mount_hostile), its memory (MEMORY_BOUND) and the limits it hits."""
MEMORY_BOUND = 500 << 20
"""Bytes: the address-space limit each CLI run gets, and the peak RSS it must stay under."""
READ_BOUND = 16 << 20
"""Bytes a CLI run may read through system calls (rchar: the checkpoint, modules it imports late; 0.75 MiB at
most measured over the hostile suite)."""
WRITE_BOUND = Limits().max_generated_bytes + (1 << 20)
"""Bytes a CLI run may write (wchar): the most text ``max_generated_bytes`` lets it make, and a line or two
(67 MiB at most measured)."""
KILL_AFTER = HANG_SECONDS
"""A run still going after this long is killed and reported."""


@dataclass
class CliResult:
    rc: int
    timed_out: bool
    wall: float
    cpu: float
    maxrss: int
    read: int
    """Bytes the run read through system calls (``/proc/PID/io`` rchar)."""
    written: int
    """Bytes it wrote (wchar)."""
    stdout: str
    stderr: str


class Runner:
    """The fork server of ``runner.py``: every command in a fresh child under RLIMIT_AS."""

    def __init__(self) -> None:
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
        self.proc = subprocess.Popen([sys.executable, str(HERE / "runner.py")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)

    def run(self, *argv: str | Path, memory: int = MEMORY_BOUND) -> CliResult:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        request = {"argv": [str(a) for a in argv], "timeout": KILL_AFTER, "memory": memory}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer = json.loads(self.proc.stdout.readline())
        return CliResult(answer["rc"], answer["timed_out"], answer["wall"], answer["cpu"], answer["maxrss"],
                         answer["read"], answer["written"], answer["stdout"], answer["stderr"])

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


@pytest.fixture(scope="session")
def runner() -> Iterator[Runner]:
    r = Runner()
    yield r
    r.close()


@pytest.fixture(scope="session")
def seeds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("seeds")
    write_seeds(out)
    return {name: (out / name).read_bytes() for name in SEED_NAMES}


@pytest.fixture(scope="session")
def env(tmp_path_factory: pytest.TempPathFactory, seeds: dict[str, bytes]) -> Env:
    return Env(tmp_path_factory.mktemp("canary") / "canary", seeds)


@pytest.fixture(scope="session")
def hostile_files(tmp_path_factory: pytest.TempPathFactory, env: Env) -> dict[str, Path]:
    """Every case of the corpus written to disk, by name."""
    directory = tmp_path_factory.mktemp("hostile")
    files = {}
    for case in CASES:
        files[case.name] = write_case(directory / case.name, case.build(env))
    return files


@pytest.fixture
def fuse() -> None:
    require_fuse()


@pytest.fixture
def mounts(fuse: None, tmp_path: Path) -> Iterator[Mounts]:
    made = Mounts(tmp_path / "mnt")
    try:
        yield made
    finally:
        made.cleanup()


@pytest.fixture(autouse=True)
def canary_never_appears(env: Env) -> Iterator[None]:
    assert not env.canary.exists()
    yield
    assert not env.canary.exists(), "a payload ran: the canary file exists"
