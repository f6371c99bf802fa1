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

from hostile.cases import CASES, Env, write_case
from hostile.mounting import Mounts
from hostile.seeds import SEED_NAMES, write_seeds

HERE = Path(__file__).resolve().parent
CPU_BOUND = 2.0
"""CPU seconds any hostile case may take, end to end: the time of the ckptfs processes themselves, which a busy
machine does not stretch as it stretches wall time (the README's "within 2 s")."""
WALL_BOUND = 20.0
"""Wall seconds: ten times the CPU bound, room for a loaded 2-core machine; a case past it hangs."""
MEMORY_BOUND = 500 << 20
"""Bytes: the address-space limit each CLI run gets, and the peak RSS it must stay under."""
KILL_AFTER = 30.0
"""A run still going after this long is killed and reported (it has failed the wall bound before)."""


@dataclass
class CliResult:
    rc: int
    timed_out: bool
    wall: float
    cpu: float
    maxrss: int
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
                         answer["stdout"], answer["stderr"])

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
