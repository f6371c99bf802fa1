"""Reads through a mount of an http:// checkpoint become few, large GETs (nginx's access log counts them)."""

from __future__ import annotations

import subprocess

import numpy as np
import torch
from remote_servers import Nginx, nginx  # noqa: F401  (fixture)

from mount.helpers import Mounter

MiB = 1 << 20


def test_memmap_page_faults_and_cat_become_large_gets(nginx: Nginx, mounter: Mounter) -> None:  # noqa: F811
    generator = torch.Generator().manual_seed(21)
    tensors = {"w": torch.randn(4 * MiB, generator=generator), "next": torch.randn(2 * MiB, generator=generator)}
    torch.save(tensors, nginx.root / "faulted.pt")
    mnt = mounter(f"{nginx.url}/faulted.pt")  # type: ignore[arg-type]
    mark = nginx.mark()
    mapped = np.memmap(mnt / "w", np.float32, "r")
    assert np.array_equal(mapped, tensors["w"].numpy())
    faulted = nginx.since(mark)
    assert len(faulted) <= 12 and sum(r.sent for r in faulted) <= 17 * MiB, [r.sent for r in faulted]
    mark = nginx.mark()
    cat = subprocess.run(["cat", str(mnt / "next")], capture_output=True, check=True).stdout
    assert cat == tensors["next"].numpy().tobytes()
    assert len(nginx.since(mark)) <= 8
