"""``/.zarr``'s chunk grid (``-o zarr_chunk=SIZE``, fsspec ``zarr_chunk=``): each array split along its first axis
into chunks of whole rows, each its own key and one range of the tensor's bytes. zarr-python and tensorstore read
them through a real mount and through fsspec without FUSE, equal to torch; a slice over s3:// fetches only its
chunks (bytes counted by nginx in front of moto)."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import fsspec
import numpy as np
import pytest
import tensorstore
import torch
import zarr
from corpus import save_zip
from fsspec.implementations.asyn_wrapper import AsyncFileSystemWrapper
from remote_servers import MotoS3, Nginx, moto_proxy, moto_s3  # noqa: F401  (fixtures)
from zarr.storage import FsspecStore

from ckptfs.errors import MountError
from ckptfs.fsspec import CheckpointFileSystem
from ckptfs.fuse.mount_options import MountOptions, with_options
from mount.helpers import Mounter

MiB = 1 << 20


def tensors() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(23)
    wide = torch.randn(40, 300, generator=generator)
    return {
        "rows": torch.randn(1000, 37, generator=generator),  # 148-byte rows: 6 a KiB chunk, the last one padded
        "cube": torch.randint(-100, 100, (30, 4, 5), generator=generator, dtype=torch.int16),
        "wide": wide,  # 1,200-byte rows: larger than a chunk, one row each
        "transposed": wide.t(),  # gathered, not stored as it is
        "scalar": torch.tensor(3.5, dtype=torch.float64),
        "empty": torch.zeros(0, 5),
        "hollow": torch.zeros(6, 0),
        "brain": torch.randn(100, 3, generator=generator).to(torch.bfloat16),  # zarr has no bfloat16: uint16 bits
        "flags": torch.rand(50, generator=generator) > 0.5,
    }


def expected(tensor: torch.Tensor) -> np.ndarray:
    return (tensor.view(torch.uint16) if tensor.dtype == torch.bfloat16 else tensor.contiguous()).numpy()


def chunk_keys(listing: list[str]) -> list[str]:
    return sorted((name for name in listing if name != "zarr.json"), key=lambda key: int(key.split(".")[1]))


def check_arrays(group: zarr.Group, where: Path | None) -> None:
    for name, tensor in tensors().items():
        array = group[name]
        assert array.shape == tuple(tensor.shape) and np.array_equal(array[...], expected(tensor)), name
        if where is not None:
            opened = tensorstore.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(where / name)}},
                                      read=True).result()
            assert np.array_equal(opened.read().result(), expected(tensor)), name
    assert np.array_equal(group["rows"][500:530, 2:5], tensors()["rows"].numpy()[500:530, 2:5])


def test_a_mount_chunks_each_array_in_whole_rows(tmp_path: Path, mounter: Mounter) -> None:
    source = save_zip(tensors(), tmp_path / "chunked.pt")
    mnt = mounter(source, "-o", "zarr_chunk=1KiB")
    rows = mnt / ".zarr" / "rows"
    document = json.loads((rows / "zarr.json").read_text())
    assert document["chunk_grid"]["configuration"]["chunk_shape"] == [6, 37]
    assert document["chunk_key_encoding"] == {"name": "default", "configuration": {"separator": "."}}
    keys = chunk_keys(os.listdir(rows))
    assert keys == [f"c.{i}.0" for i in range(167)]
    data = tensors()["rows"].numpy().tobytes()
    assert (rows / "c.3.0").read_bytes() == data[3 * 888 : 4 * 888]
    assert (rows / "c.166.0").read_bytes() == data[166 * 888 :] + bytes(888 - len(data[166 * 888 :]))
    assert chunk_keys(os.listdir(mnt / ".zarr" / "wide")) == [f"c.{i}.0" for i in range(40)]
    assert chunk_keys(os.listdir(mnt / ".zarr" / "cube")) == ["c.0.0.0", "c.1.0.0"]  # 40-byte rows: 25 a chunk
    assert sorted(os.listdir(mnt / ".zarr" / "scalar")) == ["c", "zarr.json"]
    assert os.listdir(mnt / ".zarr" / "empty") == ["zarr.json"]
    assert os.listdir(mnt / ".zarr" / "hollow") == ["zarr.json"]
    check_arrays(zarr.open_group(mnt / ".zarr", mode="r"), mnt / ".zarr")
    one = mounter(source, "-o", "zarr_chunk=0")
    assert chunk_keys(os.listdir(one / ".zarr" / "rows")) == ["c.0.0"]
    assert (one / ".zarr" / "rows" / "c.0.0").read_bytes() == data
    check_arrays(zarr.open_group(one / ".zarr", mode="r"), one / ".zarr")


def test_zarr_chunk_option() -> None:
    assert MountOptions().zarr_chunk == 4 * MiB
    assert with_options(MountOptions(), ["ro,zarr_chunk=256KiB"]).zarr_chunk == 256 << 10
    assert with_options(MountOptions(), ["zarr_chunk=0"]).zarr_chunk == 0
    with pytest.raises(MountError, match=r"^-o zarr_chunk=lots: 'lots' is not a size or count"):
        with_options(MountOptions(), ["zarr_chunk=lots"])


def test_fsspec_without_fuse_reads_the_same_chunks(tmp_path: Path) -> None:
    source = save_zip(tensors(), tmp_path / "chunked.pt")
    fs = CheckpointFileSystem(fo=str(source), zarr_chunk="1KiB")
    assert chunk_keys([p.rpartition("/")[2] for p in fs.ls(".zarr/rows", detail=False)]) == [
        f"c.{i}.0" for i in range(167)]
    store = FsspecStore(AsyncFileSystemWrapper(fs, asynchronous=True), path=".zarr", read_only=True)
    check_arrays(zarr.open_group(store, mode="r"), None)
    opened = tensorstore.open({"driver": "zarr3", "kvstore": {"driver": "memory"}, "metadata": json.loads(
        fs.cat_file(".zarr/rows/zarr.json"))}, create=True).result()
    assert opened.shape == (1000, 37)  # tensorstore takes the document as written


def test_a_slice_over_s3_fetches_only_its_chunks(moto_s3: MotoS3, moto_proxy: Nginx) -> None:  # noqa: F811
    big = torch.randn(16384, 1024, generator=torch.Generator().manual_seed(5))  # 64 MiB, 4 KiB rows
    buffer = io.BytesIO()
    torch.save({"big": big}, buffer)
    moto_s3.client.create_bucket(Bucket="zarrs")
    moto_s3.client.put_object(Bucket="zarrs", Key="big.pt", Body=buffer.getvalue())
    options = {"key": moto_s3.env["AWS_ACCESS_KEY_ID"], "secret": moto_s3.env["AWS_SECRET_ACCESS_KEY"],
               "client_kwargs": {"endpoint_url": moto_proxy.url, "region_name": "us-east-1"}}
    fs = fsspec.filesystem("ckpt", fo="s3://zarrs/big.pt", target_options=options)
    mark = moto_proxy.mark()
    group = zarr.open_group(FsspecStore(AsyncFileSystemWrapper(fs, asynchronous=True), path=".zarr", read_only=True),
                            mode="r")
    assert np.array_equal(group["big"][0:2, 0:3], big.numpy()[0:2, 0:3])
    fetched = sum(r.sent for r in moto_proxy.since(mark, at_least=1))
    assert 4 * MiB <= fetched <= 8 * MiB  # the first 1,024 rows' chunk, read-ahead within the storage bounded
    mark = moto_proxy.mark()
    assert np.array_equal(group["big"][8000:8001, 1000:], big.numpy()[8000:8001, 1000:])
    assert sum(r.sent for r in moto_proxy.since(mark, at_least=1)) <= 8 * MiB


def test_a_slice_through_an_s3_mount_fetches_only_its_chunks(moto_s3: MotoS3, moto_proxy: Nginx,  # noqa: F811
                                                             mounter: Mounter,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    big = torch.randn(8192, 1024, generator=torch.Generator().manual_seed(6))  # 32 MiB, 4 KiB rows
    buffer = io.BytesIO()
    torch.save({"big": big}, buffer)
    moto_s3.client.create_bucket(Bucket="zarr-mounts")
    moto_s3.client.put_object(Bucket="zarr-mounts", Key="big.pt", Body=buffer.getvalue())
    for name, value in moto_s3.env.items():
        monkeypatch.setenv(name, value)
    mark = moto_proxy.mark()
    mnt = mounter("s3://zarr-mounts/big.pt",  # type: ignore[arg-type]
                  "--endpoint-url", moto_proxy.url, "-o", "zarr_chunk=1MiB")
    opened = len(moto_proxy.since(mark, at_least=1))
    mark = moto_proxy.mark()
    array = zarr.open_array(mnt / ".zarr" / "big", mode="r")
    assert array.chunks == (256, 1024)
    assert np.array_equal(array[300:302, 0:3], big.numpy()[300:302, 0:3])
    store = tensorstore.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(mnt / ".zarr" / "big")}},
                             read=True).result()
    assert np.array_equal(store[7000:7002, 5:9].read().result(), big.numpy()[7000:7002, 5:9])
    fetched = sum(r.sent for r in moto_proxy.since(mark, at_least=1))
    assert opened >= 1 and 2 * MiB <= fetched <= 8 * MiB  # two 1 MiB chunks and read-ahead, not 32 MiB
