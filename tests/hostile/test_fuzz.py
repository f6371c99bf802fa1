"""The bounded CI run of the mutation fuzzer (``scripts/fuzz`` runs the long one): no crash, hang or blow-up.

The run is bounded by a count of inputs and a fixed seed, not by a time: a loaded machine runs the same inputs,
only slower (the timeout is a guard against a hang, far above the run's usual ~45 s).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hostile.seeds import SEED_NAMES

INPUTS = 20_000
SEED = 20261126
TESTS = Path(__file__).resolve().parents[1]
FUZZ_HANG_SECONDS = 20.0
"""CPU seconds one input may take before it counts as a hang: a guard ten times above the fuzzer's own 2 s, which a
loaded machine can pass (CPU time drifts with load too); the inputs' work is bounded by count and by memory."""


def test_fuzz_bounded_run(seeds: dict[str, bytes], tmp_path: Path) -> None:
    seed_dir = tmp_path / "seeds"
    seed_dir.mkdir()
    for name in SEED_NAMES:
        (seed_dir / name).write_bytes(seeds[name])
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(TESTS), "OPENBLAS_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "hostile.fuzz", "--inputs", str(INPUTS), "--seed", str(SEED), "--workers", "2",
                             "--seeds", str(seed_dir), "--out", str(out), "--json",
                             "--hang-seconds", str(FUZZ_HANG_SECONDS)],
                            capture_output=True, text=True, env=env, timeout=900)
    summary = json.loads(result.stdout)
    findings = {name: (out / f"{name}.txt").read_text()[-2000:] for name in summary["saved"]}
    assert summary["inputs"] >= INPUTS, summary
    assert (summary["crashes"], summary["memory"], summary["hangs"], summary["died"]) == (0, 0, 0, 0), findings
    assert not summary["canary"]
    assert summary["max_rss"] < 500 << 20
    assert result.returncode == 0
