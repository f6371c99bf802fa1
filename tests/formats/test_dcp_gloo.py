"""A DCP directory written by a real 2-process gloo job: ckptfs reads what torch's own reader assembles."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch
from dcp_writers import raw_bytes, torch_view
from remote_servers import free_port

import ckptfs

JOB = Path(__file__).with_name("dcp_gloo_job.py")


def test_two_ranks_over_gloo(tmp_path: Path) -> None:
    out = tmp_path / "gloo2"
    for _ in range(3):  # the port may be taken between its choice and the job's bind, on a busy machine
        job = subprocess.run([sys.executable, str(JOB), str(out), str(free_port())], timeout=600,
                             capture_output=True, text=True)
        if job.returncode == 0:
            break
    assert job.returncode == 0, job.stderr[-4000:]
    assert sorted(p.name for p in out.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    theirs = torch_view(out, tmp_path / "torch.pt")
    with ckptfs.open(out) as ck:
        assert list(ck.root) == ["a", "b", "r", "plain", "extra"] and ck.root["extra"] == {"step": 3}
        for key in ("a", "b", "r", "plain"):
            assert ck.read(ck.tensor((key,))) == raw_bytes(theirs[key]), key
        assert ck.to_numpy(ck.tensor(("a",))).tolist() == torch.arange(20.0).reshape(5, 4).tolist()
        assert {c.offsets: c.file for c in ck.tensor(("a",)).chunks or ()} == {(0, 0): "__0_0.distcp",
                                                                               (3, 0): "__1_0.distcp"}
        assert [c.offsets for c in ck.tensor(("b",)).chunks or ()] == [(0, 0), (0, 2)]
        assert len(ck.tensor(("r",)).chunks or ()) == 1
