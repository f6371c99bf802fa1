"""The torch side: a warm worker process (``torch_worker.py``) that makes checkpoints and times ``torch.load``."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from typing import Any

from common import LIB, BenchError


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
