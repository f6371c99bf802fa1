"""Control: each code-running payload of the corpus does run code under Python's own unpickler.

Without this, "the canary never appears" could just mean the payloads were broken.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hostile.payloads import PAYLOADS

LOADER = """
import pickle, sys
try:
    pickle.loads(sys.stdin.buffer.read())
except Exception:
    pass  # several payloads fail after their call has run (the result is not a checkpoint)
"""


@pytest.mark.parametrize("name", PAYLOADS)
def test_payload_runs_code_under_pickle(name: str, tmp_path: Path) -> None:
    canary = tmp_path / "control-canary"
    payload = PAYLOADS[name]
    subprocess.run([sys.executable, "-c", payload.setup + LOADER], input=payload.build(str(canary)),
                   check=True, timeout=30, cwd=tmp_path)
    assert canary.exists(), f"{name} did not run under pickle.loads"
