"""A remote mount answers reads from the memfd its fetched blocks are in (``sources.remote.blocks``): the bytes
cat, dd and np.memmap read are torch's, over a cache smaller than the tensors (blocks evicted and reused while
replies are sent from others), single- and multithreaded, over nginx and moto."""

from __future__ import annotations

import io
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from remote_servers import MotoS3, Nginx, moto_s3, nginx  # noqa: F401  (fixtures)

from mount.helpers import Mounter, daemon_pids

MiB = 1 << 20


def tensors() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(25)
    return {"big": torch.randn(24 * MiB, generator=generator),  # 96 MiB: three times the cache
            "half": torch.randn(3 * MiB, generator=generator).to(torch.float16),
            "small": torch.randn(1000, generator=generator)}


def stored(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().view(torch.uint8).numpy().tobytes()


def check_reads(mnt: Path, saved: dict[str, torch.Tensor]) -> None:
    dd = subprocess.run(["dd", f"if={mnt / 'big'}", "bs=1M", "status=none"], capture_output=True, check=True)
    assert dd.stdout == stored(saved["big"])
    assert subprocess.run(["cat", str(mnt / "half")], capture_output=True, check=True).stdout == stored(saved["half"])
    mapped = np.memmap(mnt / "big", np.float32, "r")
    assert np.array_equal(mapped[::4099], saved["big"].numpy()[::4099])
    assert (mnt / "small").read_bytes() == stored(saved["small"])
    with open(mnt / "big", "rb") as file:  # reads across the blocks of several fetches, out of order
        for offset in (80 * MiB - 3, 7, 40 * MiB + 12345, 96 * MiB - 4096):
            file.seek(offset)
            assert file.read(1 << 17) == stored(saved["big"])[offset : offset + (1 << 17)], offset


def memfds(mnt: Path) -> set[int]:
    """The memfds the daemon has open, by inode (``mmap`` keeps a descriptor of its own)."""
    (pid,) = daemon_pids(mnt)
    fds = [f"/proc/{pid}/fd/{fd}" for fd in os.listdir(f"/proc/{pid}/fd")]
    return {os.stat(fd).st_ino for fd in fds if os.readlink(fd).startswith("/memfd:ckptfs-blocks")}


@pytest.mark.parametrize("threads", [[], ["--multithreaded"]], ids=["single", "multithreaded"])
def test_reads_of_an_http_mount_from_its_memfd_are_torchs_bytes(nginx: Nginx, mounter: Mounter,  # noqa: F811
                                                                 threads: list[str]) -> None:
    saved = tensors()
    torch.save(saved, nginx.root / "memfd.pt")
    # A small suffix GET: parsing reads the zip's records through the cache's blocks before the daemon forks.
    mnt = mounter(f"{nginx.url}/memfd.pt", "--no-cache", "--cache-size", "32MiB",  # type: ignore[arg-type]
                  "--storage-option", "tail_size=4KiB", *threads)
    assert memfds(mnt) == set()  # the parent's, shared with it, is closed: its blocks may still be written
    check_reads(mnt, saved)
    assert len(memfds(mnt)) == 1  # its own, made on its first fetch


def test_reads_of_an_s3_mount_from_its_memfd_are_torchs_bytes(moto_s3: MotoS3, mounter: Mounter,  # noqa: F811
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    saved = tensors()
    buffer = io.BytesIO()
    torch.save(saved, buffer)
    moto_s3.client.create_bucket(Bucket="memfd")
    moto_s3.client.put_object(Bucket="memfd", Key="model.pt", Body=buffer.getvalue())
    for name, value in moto_s3.env.items():
        monkeypatch.setenv(name, value)
    mnt = mounter("s3://memfd/model.pt", "--endpoint-url", moto_s3.url, "--no-cache",  # type: ignore[arg-type]
                  "--cache-size", "32MiB")
    check_reads(mnt, saved)
    assert len(memfds(mnt)) == 1
