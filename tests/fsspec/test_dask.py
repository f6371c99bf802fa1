"""``ckpt`` file systems on a real ``distributed.LocalCluster`` (two worker processes) against moto behind nginx,
whose log counts requests and bytes: tasks handed the client's file system read the version it pinned, with its
parse; a replaced object raises in every worker; ``ckptfs.dask`` and ``dask.array.from_zarr`` over the chunked
``.zarr`` view compute what torch holds, fetching each byte about once."""

from __future__ import annotations

import io
from typing import Any, Iterator

import numpy as np
import pytest
import torch
from remote_servers import MotoS3, Nginx, moto_proxy, moto_s3  # noqa: F401  (fixtures)

from ckptfs.fsspec import CheckpointFileSystem

distributed = pytest.importorskip("distributed", reason="pip install -e '.[dask]'")
da = pytest.importorskip("dask.array")
MiB = 1 << 20


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=2, dashboard_address=None,
                                  silence_logs=40) as cluster, distributed.Client(cluster) as connected:
        yield connected


def state() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(29)
    tensors = {f"small.{i}": torch.randn(8, 8, generator=generator) for i in range(64)}
    tensors["big"] = torch.randn(4096, 1024, generator=generator)  # 16 MiB, 4 KiB rows
    tensors["far"] = torch.randn(2 * MiB, generator=generator)  # 8 MiB, read only once the object is replaced
    return tensors


def raw(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().view(torch.uint8).numpy().tobytes()


def put(moto_s3: MotoS3, key: str, tensors: dict[str, torch.Tensor]) -> None:  # noqa: F811
    buffer = io.BytesIO()
    torch.save(tensors, buffer)
    moto_s3.client.put_object(Bucket="cluster", Key=key, Body=buffer.getvalue())


def filesystem(moto_s3: MotoS3, proxy: Nginx, key: str, **options: Any) -> CheckpointFileSystem:  # noqa: F811
    target = {"key": moto_s3.env["AWS_ACCESS_KEY_ID"], "secret": moto_s3.env["AWS_SECRET_ACCESS_KEY"],
              "client_kwargs": {"endpoint_url": proxy.url, "region_name": "us-east-1"}, "tail_size": "64KiB"}
    return CheckpointFileSystem(fo=f"s3://cluster/{key}", target_options=target, **options)


def read(fs: CheckpointFileSystem, path: str) -> bytes:
    return fs.cat_file(path)


def read_or_error(fs: CheckpointFileSystem, path: str) -> str:
    try:
        fs.cat_file(path)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "read"


def test_tasks_handed_the_file_system_read_its_version_with_its_parse(client: Any, moto_s3: MotoS3,  # noqa: F811
                                                                      moto_proxy: Nginx) -> None:  # noqa: F811
    moto_s3.client.create_bucket(Bucket="cluster")
    tensors = state()
    put(moto_s3, "handed.pt", tensors)
    fs = filesystem(moto_s3, moto_proxy, "handed.pt")
    mark = moto_proxy.mark()
    futures = [client.submit(read, fs, f"small.{i}", pure=False) for i in range(64)]
    assert client.gather(futures) == [raw(tensors[f"small.{i}"]) for i in range(64)]
    requests = moto_proxy.since(mark, at_least=1)
    assert len(requests) <= 64 + 8 and not any(r.range.startswith("bytes=-") for r in requests)  # no opening GET

    put(moto_s3, "handed.pt", {**tensors, "far": torch.zeros(2 * MiB)})
    mark = moto_proxy.mark()
    answers = client.run(read_or_error, fs, "far")
    assert len(answers) == 2
    for answer in answers.values():
        assert answer.startswith("ObjectChangedError: s3://cluster/handed.pt: the object was replaced"), answer
        assert "unmount" not in answer
    requests = moto_proxy.since(mark, at_least=2)
    assert requests and all(r.status == 412 and r.sent < 1024 for r in requests)  # no byte of the new object


def test_dask_arrays_of_a_tensor_and_of_its_zarr_view(client: Any, moto_s3: MotoS3,  # noqa: F811
                                                      moto_proxy: Nginx) -> None:  # noqa: F811
    import ckptfs.dask
    import zarr
    from fsspec.implementations.asyn_wrapper import AsyncFileSystemWrapper
    from zarr.storage import FsspecStore

    moto_s3.client.create_bucket(Bucket="cluster")
    tensors = state()
    put(moto_s3, "arrays.pt", tensors)
    big = tensors["big"].numpy()
    fs = filesystem(moto_s3, moto_proxy, "arrays.pt", zarr_chunk="1MiB")
    mark = moto_proxy.mark()
    array = ckptfs.dask.from_checkpoint(fs, "big", chunks=256)
    assert array.chunks[0] == (256,) * 16 and array.chunks[1] == (1024,)
    assert np.array_equal(array.compute(), big)
    assert abs(float(array.sum().compute()) - float(big.sum(dtype=np.float64))) < 1e-2
    fetched = sum(r.sent for r in moto_proxy.since(mark, at_least=1))
    # Computed twice, by 2 workers: each fetches its blocks' rows, and its read-ahead stops at the tensor's end (how
    # far ahead it reads follows the connection's measured rate, so a loaded machine's workers read further).
    assert 16 * MiB <= fetched <= 2 * 2 * 16 * MiB
    assert np.array_equal(ckptfs.dask.from_checkpoint(fs, "small.3").compute(), tensors["small.3"].numpy())

    fresh = filesystem(moto_s3, moto_proxy, "arrays.pt", zarr_chunk="1MiB")
    store = FsspecStore(AsyncFileSystemWrapper(fresh, asynchronous=True), path=".zarr", read_only=True)
    view = zarr.open_array(store, path="big", mode="r")
    assert view.chunks == (256, 1024)
    mark = moto_proxy.mark()
    total = da.from_zarr(view).sum().compute()
    assert abs(float(total) - float(big.sum(dtype=np.float64))) < 1e-2
    assert sum(r.sent for r in moto_proxy.since(mark, at_least=1)) <= 1.25 * 16 * MiB


def test_from_checkpoint_blocks_shapes_and_dtypes(tmp_path: Any) -> None:
    import ckptfs.dask
    from ckptfs.errors import CkptfsError

    generator = torch.Generator().manual_seed(31)
    tensors = {"w": torch.randn(100, 7, 3, generator=generator), "scalar": torch.tensor(2.5, dtype=torch.float64),
               "brain": torch.randn(9, 4, generator=generator).to(torch.bfloat16), "empty": torch.zeros(0, 3),
               "t": torch.randn(6, 5, generator=generator).t(), "group": {"x": torch.arange(4)}}
    torch.save(tensors, tmp_path / "m.pt")
    path = str(tmp_path / "m.pt")
    for chunks, first in ((None, (100,)), (30, (30, 30, 30, 10)), ((25, 7, 2), (25, 25, 25, 25))):
        array = ckptfs.dask.from_checkpoint(path, "w", chunks=chunks)
        assert array.chunks[0] == first
        assert np.array_equal(array.compute(scheduler="sync"), tensors["w"].numpy())
    assert np.array_equal(ckptfs.dask.from_checkpoint(path, "w", chunks=(25, 7, 2))[30:31, 3:, 1:].compute(
        scheduler="sync"), tensors["w"].numpy()[30:31, 3:, 1:])
    assert ckptfs.dask.from_checkpoint(path, "scalar").compute(scheduler="sync") == 2.5
    brain = ckptfs.dask.from_checkpoint(path, "brain")
    assert brain.dtype == np.uint16 and np.array_equal(brain.compute(scheduler="sync"),
                                                       tensors["brain"].view(torch.uint16).numpy())
    assert ckptfs.dask.from_checkpoint(path, "empty").compute(scheduler="sync").shape == (0, 3)
    assert np.array_equal(ckptfs.dask.from_checkpoint(path, "t", chunks=2).compute(scheduler="sync"),
                          tensors["t"].numpy())  # gathered: a transposed view's logical bytes
    assert np.array_equal(ckptfs.dask.from_checkpoint(path, "group/x").compute(scheduler="sync"), np.arange(4))
    with pytest.raises(CkptfsError, match=r"m\.pt: group is not a tensor$"):
        ckptfs.dask.from_checkpoint(path, "group")
    with pytest.raises(FileNotFoundError):
        ckptfs.dask.from_checkpoint(path, "missing")
