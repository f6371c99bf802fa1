"""Many readers at once on one remote mount: reads the cache misses are answered from threads of their own
(``fuse.turns``), so several processes reading different tensors each get torch's bytes, one reader's failing
tensor is that reader's EIO alone, and an unmount with reads in flight leaves no daemon or mount behind."""

from __future__ import annotations

import os
import subprocess
import zipfile
from pathlib import Path

import pytest
import torch
from remote_servers import FaultProxy, Nginx, fault_proxy, nginx  # noqa: F401  (fixtures)

from mount.helpers import Mounter, daemon_pids, mount_points, wait_until

pytestmark = pytest.mark.mount
MiB = 1 << 20
READERS = 6


def tensors() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(31)
    return {f"t{i}": torch.randn(2 * MiB + 1000 * i, generator=generator) for i in range(READERS)}  # ~8 MiB each


def stored(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().view(torch.uint8).numpy().tobytes()


def readers(mnt: Path, names: list[str]) -> list[subprocess.Popen[bytes]]:
    """One ``dd bs=1M`` process a tensor, all started before any is waited for."""
    return [subprocess.Popen(["dd", f"if={mnt / name}", "bs=1M", "status=none"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE) for name in names]


@pytest.mark.parametrize("threads", [[], ["--multithreaded"]], ids=["single", "multithreaded"])
def test_readers_of_different_tensors_at_once_get_torchs_bytes(nginx: Nginx, mounter: Mounter,  # noqa: F811
                                                               threads: list[str]) -> None:
    saved = tensors()
    torch.save(saved, nginx.root / "readers.pt")
    # A cache smaller than what the readers read together: blocks are evicted while others' replies are sent.
    mnt = mounter(f"{nginx.url}/readers.pt", "--no-cache", "--cache-size", "32MiB", *threads)  # type: ignore[arg-type]
    for _ in range(2):  # then again, from a cache that no longer holds the first tensors
        procs = readers(mnt, sorted(saved))
        outputs = [proc.communicate() for proc in procs]
        assert [proc.returncode for proc in procs] == [0] * READERS, [err for _, err in outputs]
        assert [out for out, _ in outputs] == [stored(saved[name]) for name in sorted(saved)]


def test_a_reader_waiting_on_a_slow_get_stalls_no_other(nginx: Nginx, fault_proxy: FaultProxy,  # noqa: F811
                                                         mounter: Mounter) -> None:
    saved = tensors()
    torch.save(saved, nginx.root / "slow.pt")
    mnt = mounter(f"{fault_proxy.url}/slow.pt", "--no-cache")  # type: ignore[arg-type]
    fault_proxy.slow_seconds = 10.0
    fault_proxy.faults = ["slow"]
    (waiting,) = readers(mnt, ["t3"])
    wait_until(lambda: fault_proxy.active > 0)
    (other,) = readers(mnt, ["t1"])  # a single-threaded FUSE loop would answer it only after t3's first GET
    assert other.communicate(timeout=60)[0] == stored(saved["t1"])
    assert waiting.stdout is not None
    os.set_blocking(waiting.stdout.fileno(), False)
    with pytest.raises(BlockingIOError):  # t3's reader still has not one byte
        os.read(waiting.stdout.fileno(), 1)
    os.set_blocking(waiting.stdout.fileno(), True)
    assert waiting.communicate(timeout=60)[0] == stored(saved["t3"])


def test_one_readers_failing_tensor_is_its_eio_alone(nginx: Nginx, mounter: Mounter) -> None:  # noqa: F811
    saved = tensors()
    path = nginx.root / "broken.pt"
    torch.save(saved, path)
    with zipfile.ZipFile(path) as archive:  # t2's storage: its local header's signature spoiled
        (info,) = [i for i in archive.infolist() if i.filename.endswith("/data/2")]
    with open(path, "r+b") as file:
        file.seek(info.header_offset)
        file.write(b"XX")
    mnt = mounter(f"{nginx.url}/broken.pt", "--no-cache")  # type: ignore[arg-type]
    names = sorted(saved)
    procs = readers(mnt, names)
    outputs = [proc.communicate() for proc in procs]
    for name, proc, (out, err) in zip(names, procs, outputs):
        if name == "t2":
            assert proc.returncode != 0 and b"Input/output error" in err
        else:
            assert (proc.returncode, out) == (0, stored(saved[name])), err
    assert (mnt / "t0").read_bytes()[:4096] == stored(saved["t0"])[:4096]  # the daemon serves on


def test_an_unmount_with_reads_in_flight_leaves_nothing_behind(nginx: Nginx, mounter: Mounter) -> None:  # noqa: F811
    saved = tensors()
    torch.save(saved, nginx.root / "unmounted.pt")
    mnt = mounter(f"{nginx.url}/unmounted.pt", "--no-cache", "--max-connections", "1")  # type: ignore[arg-type]
    (pid,) = daemon_pids(mnt)
    procs = readers(mnt, sorted(saved))
    subprocess.run(["fusermount3", "-u", "-z", str(mnt)], check=True)
    for proc in procs:
        proc.communicate(timeout=60)  # each ends, with the bytes or an error: none hangs
    wait_until(lambda: not Path(f"/proc/{pid}").exists())
    assert str(mnt) not in mount_points()
