"""Real mounts of http:// and s3:// checkpoints: the tree and bytes of a local mount, errors as EIO."""

from __future__ import annotations

import errno
import io
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from remote_servers import FaultProxy, MotoS3, Nginx, fault_proxy, moto_s3, nginx  # noqa: F401  (fixtures)

from ckptfs.errors import MountError
from ckptfs.fuse.mount_options import MountOptions, with_options
from mount.helpers import Mounter, daemon_pids

MiB = 1 << 20


def state_dict() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(13)
    return {"embed.weight": torch.randn(1000, 64, generator=generator),
            "layers.0.bias": torch.randn(64, generator=generator).to(torch.bfloat16),
            "big": torch.randn(4 * MiB, generator=generator)}


def assert_same_as_torch(mnt: Path, tensors: dict[str, torch.Tensor]) -> None:
    for name, tensor in tensors.items():
        assert (mnt / name).read_bytes() == tensor.contiguous().view(torch.uint8).numpy().tobytes(), name
    meta = json.loads((mnt / "big.json").read_text())
    mapped = np.memmap(mnt / "big", meta["numpy_dtype"], "r", shape=tuple(meta["shape"]))
    assert np.array_equal(mapped, tensors["big"].numpy())


def test_an_http_mount_shows_the_tree_and_bytes_of_a_local_one(nginx: Nginx, mounter: Mounter) -> None:
    tensors = state_dict()
    torch.save(tensors, nginx.root / "mounted.pt")
    local = mounter(nginx.root / "mounted.pt")
    remote = mounter(f"{nginx.url}/mounted.pt")  # type: ignore[arg-type]
    assert sorted(os.listdir(remote)) == sorted(os.listdir(local))
    assert_same_as_torch(remote, tensors)
    index = json.loads((remote / ".ckptfs" / "index.json").read_text())
    assert index["source"] == f"{nginx.url}/mounted.pt"
    assert index == {**json.loads((local / ".ckptfs" / "index.json").read_text()), "source": index["source"]}
    assert (remote / "big").stat().st_mtime == int(os.path.getmtime(nginx.root / "mounted.pt"))


def test_an_s3_mount(moto_s3: MotoS3, mounter: Mounter, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    tensors = state_dict()
    buffer = io.BytesIO()
    torch.save(tensors, buffer)
    moto_s3.client.create_bucket(Bucket="mounts")
    moto_s3.client.put_object(Bucket="mounts", Key="ckpt/model.pt", Body=buffer.getvalue())
    for name, value in moto_s3.env.items():
        monkeypatch.setenv(name, value)
    mnt = mounter("s3://mounts/ckpt/model.pt", "--endpoint-url", moto_s3.url)  # type: ignore[arg-type]
    assert_same_as_torch(mnt, tensors)
    assert json.loads((mnt / ".ckptfs" / "index.json").read_text())["source"] == "s3://mounts/ckpt/model.pt"


def test_max_connections_bounds_the_gets_at_once(nginx: Nginx, fault_proxy: FaultProxy,  # noqa: F811
                                                 mounter: Mounter) -> None:
    tensors = state_dict()
    torch.save(tensors, nginx.root / "bounded.pt")
    mnt = mounter(f"{fault_proxy.url}/bounded.pt", "-o", "max_connections=1")  # type: ignore[arg-type]
    fault_proxy.most_active = 0
    assert_same_as_torch(mnt, tensors)
    assert 1 <= fault_proxy.most_active <= 2  # its one connection for parts and read-ahead, and the FUSE loop's


def test_max_connections_option() -> None:
    assert MountOptions().max_connections is None
    assert with_options(MountOptions(), ["ro,max_connections=4"]).max_connections == 4
    for bad in ("0", "257", "many"):
        with pytest.raises(MountError, match=rf"^-o max_connections={bad}: expected a whole number from 1 to 256$"):
            with_options(MountOptions(), [f"max_connections={bad}"])


def test_permanent_errors_are_eio_and_the_daemon_stays_up(nginx: Nginx, fault_proxy: FaultProxy,  # noqa: F811
                                                          mounter: Mounter, tmp_path: Path) -> None:
    tensors = state_dict()
    torch.save(tensors, nginx.root / "faulty.pt")
    log = tmp_path / "daemon.log"
    mnt = mounter(f"{fault_proxy.url}/faulty.pt", "--storage-option", "retries=2",  # type: ignore[arg-type]
                  "--log-file", str(log))
    fault_proxy.faults = ["503"] * 1000  # the kernel tries a failed read-ahead page again on its own
    with pytest.raises(OSError) as failed:
        (mnt / "big").read_bytes()
    assert failed.value.errno == errno.EIO
    fault_proxy.faults = []
    fault_proxy.faults = ["503", "reset", "short"]  # transient, fewer than the attempts per request
    expected = tensors["embed.weight"].numpy().tobytes()
    assert (mnt / "embed.weight").read_bytes() == expected
    assert (mnt / "big").read_bytes() == tensors["big"].numpy().tobytes()  # the daemon still serves
    assert daemon_pids(mnt)
    deadline = time.monotonic() + 10
    while "gave up after 2 attempts" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert f"{fault_proxy.url}/faulty.pt: HTTP 503 Service Unavailable (SlowDown) (gave up after 2 attempts)" \
        in log.read_text()


def test_concurrent_readers_of_a_multithreaded_mount_get_the_right_bytes(nginx: Nginx, mounter: Mounter) -> None:
    from concurrent.futures import ThreadPoolExecutor

    tensors = state_dict()
    torch.save(tensors, nginx.root / "threads.pt")
    mnt = mounter(f"{nginx.url}/threads.pt", "--multithreaded", "--cache-size", "32MiB")  # type: ignore[arg-type]

    def read(name: str) -> bool:
        with open(mnt / name, "rb") as f:
            chunks = iter(lambda: f.read(100_003), b"")
            return b"".join(chunks) == tensors[name].contiguous().view(torch.uint8).numpy().tobytes()

    with ThreadPoolExecutor(6) as pool:
        assert all(pool.map(read, ["big", "embed.weight", "layers.0.bias"] * 2))
