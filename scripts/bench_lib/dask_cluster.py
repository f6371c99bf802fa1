"""``scripts/bench --sections distributed``: ``ckpt`` file systems on a Dask ``LocalCluster(n_workers=2,
processes=True)`` against moto's S3 behind the tests' nginx proxy, whose access log counts requests and bytes
(``tests/remote_servers.py``). Issue 23's table, each row against its target:

* an object replaced after the client opened it: what each worker's read gives, and the bytes of the new object
  served (2xx answers after the replacement);
* 64 tasks each handed the client's file system (``client.submit(read, fs, key)``), each reading one small tensor
  of the many-tensor checkpoint: requests in all, and wall time against the scattered pattern
  (``client.scatter(fs, broadcast=True)``), the two alternated, each run on objects of their own (a worker keeps
  the file systems it unpickled: a pattern must not find the other's);
* unpickling a 20,000-tensor checkpoint's file system in a worker plus its first read: through ``ckptfs.dask``'s
  block read (``Checkpoint.read``), and another's through its first ``fs.cat_file`` (the fsspec way: a path looked
  up, then read); requests they made;
* ``a[0:2, 0:3]`` of a 64 MiB tensor through ``.zarr`` over ``ckpt://…::s3://``: bytes fetched;
* ``dask.array.from_zarr(...).sum()`` with 256-row chunks (``zarr_chunk=1MiB``, 4 KiB rows) on the cluster: equal
  to torch's sum, bytes fetched against the tensor's;
* zarr's ``sharding_indexed`` against the regular grid the view uses, the same 64 MiB array written by zarr-python
  both ways (1 MiB chunks; one shard of them) and read back through a store counting its reads: keys, reads and
  bytes for ``a[0:2, 0:3]`` and for the whole array, and the whole read's seconds.
"""
from __future__ import annotations

import io
import pickle
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from remote_servers import MotoS3, Nginx, stop  # noqa: E402

MiB = 1 << 20
BUCKET = "distributed"
TASKS = 64


def run(bench: Any, bench_log: Any) -> str:
    """Measures the section; its table (also kept as ``meta["distributed"]``)."""
    import distributed

    a = bench.args
    tensors = 2000 if a.quick else 20_000
    moto = MotoS3()
    proxy = Nginx(_fresh(bench.workdir / "distributed-proxy"), moto.url)
    figures: dict[str, Any] = {"tensors": tensors, "runs": a.runs}
    try:
        moto.client.create_bucket(Bucket=BUCKET)
        many, big = _checkpoints(tensors)
        bench_log(f"distributed: {len(many) / MiB:.1f} MiB {tensors}-tensor checkpoint, {len(big) / MiB:.0f} MiB one")
        with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=2, dashboard_address=None,
                                      silence_logs=40) as cluster, distributed.Client(cluster) as client:
            for run_i in range(a.runs):
                bench_log(f"distributed: run {run_i + 1}/{a.runs}")
                _replaced(figures, moto, proxy, client, many, run_i)
                _tasks(figures, moto, proxy, client, many, tensors, run_i)
                _unpickle(figures, moto, proxy, client, many, tensors, run_i)
                _zarr(figures, moto, proxy, client, big, run_i)
        _sharding(figures, bench.workdir / "distributed-sharding")
    finally:
        stop(proxy.process)
        stop(moto.process)
    bench.res.meta["distributed"] = figures
    return table(figures)


def _fresh(base: Path) -> Path:
    import shutil

    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    base.chmod(0o755)
    return base


def _checkpoints(tensors: int) -> tuple[bytes, bytes]:
    import torch

    generator = torch.Generator().manual_seed(23)
    state = {f"model.layers.{i // 16}.mlp.w{i % 16}.weight": torch.randn(16, 16, generator=generator)
             for i in range(tensors)}
    many = io.BytesIO()
    torch.save(state, many)
    big = io.BytesIO()
    torch.save({"big": torch.randn(16384, 1024, generator=generator)}, big)  # 64 MiB, 4 KiB rows
    return many.getvalue(), big.getvalue()


def _fs(moto: MotoS3, proxy: Nginx, key: str, **options: Any) -> Any:
    from ckptfs.fsspec import CheckpointFileSystem

    target = {"key": moto.env["AWS_ACCESS_KEY_ID"], "secret": moto.env["AWS_SECRET_ACCESS_KEY"],
              "client_kwargs": {"endpoint_url": proxy.url, "region_name": "us-east-1"}}
    return CheckpointFileSystem(fo=f"s3://{BUCKET}/{key}", target_options=target, **options)


def _put(moto: MotoS3, key: str, body: bytes) -> None:
    moto.client.put_object(Bucket=BUCKET, Key=key, Body=body)


def _add(figures: dict[str, Any], name: str, value: Any) -> None:
    figures.setdefault(name, []).append(value)


def read_tensor(fs: Any, path: str) -> int:
    return len(fs.cat_file(path))


def read_or_error(fs: Any, path: str) -> str:
    try:
        fs.cat_file(path)
    except Exception as exc:
        return type(exc).__name__
    return "read"


def unpickle_and_read(pickled: bytes, index: int) -> tuple[float, float]:
    """In a worker: seconds to unpickle, then to read tensor ``index`` through ``Checkpoint.read`` (ckptfs.dask's
    block read)."""
    start = time.perf_counter()
    fs = pickle.loads(pickled)
    loaded = time.perf_counter()
    checkpoint = fs.checkpoint
    checkpoint.read(checkpoint.tensors[index])
    return loaded - start, time.perf_counter() - loaded


def unpickle_and_cat(pickled: bytes, path: str) -> float:
    """In a worker: seconds to unpickle, then to read ``path`` through ``fs.cat_file`` (its lookup, then its read)."""
    start = time.perf_counter()
    pickle.loads(pickled).cat_file(path)
    return time.perf_counter() - start


def open_and_read(pickled: bytes, index: int) -> float:
    """In a worker, side by side with ``unpickle_and_read``: what a copy cost before issue 23, a new file system of
    the same arguments (the opening GET, the parse) and the same read through ``Checkpoint.read``."""
    template = pickle.loads(pickled)
    options = {key: value for key, value in template.storage_options.items() if key != "_carried"}
    start = time.perf_counter()
    fs = type(template)(*template.storage_args, **options)
    fs.checkpoint.read(fs.checkpoint.tensors[index])
    return time.perf_counter() - start


def _replaced(figures: dict[str, Any], moto: MotoS3, proxy: Nginx, client: Any, many: bytes, run_i: int) -> None:
    key = f"replaced-{run_i}.pt"
    _put(moto, key, many)
    fs = _fs(moto, proxy, key)
    _put(moto, key, many[:-1] + bytes([many[-1] ^ 1]))  # another object of the same size: only the ETag differs
    mark = proxy.mark()
    answers = client.run(read_or_error, fs, "model.layers.3.mlp.w5.weight")
    served = sum(r.sent for r in proxy.since(mark, at_least=len(answers)) if 200 <= r.status < 300)
    _add(figures, "replaced_raised", sum(answer == "ObjectChangedError" for answer in answers.values()))
    _add(figures, "replaced_workers", len(answers))
    _add(figures, "replaced_bytes_served", served)


def _tasks(figures: dict[str, Any], moto: MotoS3, proxy: Nginx, client: Any, many: bytes, tensors: int,
           run_i: int) -> None:
    paths = [f"model.layers.{i // 16}.mlp.w{i % 16}.weight" for i in range(0, tensors, max(1, tensors // TASKS))]
    paths = paths[:TASKS]
    order = ("handed", "scattered") if run_i % 2 == 0 else ("scattered", "handed")
    seconds = {}
    for pattern in order:
        key = f"{pattern}-{run_i}.pt"
        _put(moto, key, many)
        fs = _fs(moto, proxy, key)
        mark = proxy.mark()
        start = time.perf_counter()
        handed = fs if pattern == "handed" else client.scatter(fs, broadcast=True)
        sizes = client.gather([client.submit(read_tensor, handed, path, pure=False) for path in paths])
        seconds[pattern] = time.perf_counter() - start
        assert sizes == [1024] * len(paths), sizes
        _add(figures, f"tasks_{pattern}_requests", len(proxy.since(mark, at_least=1)))
        _add(figures, f"tasks_{pattern}_s", seconds[pattern])
    _add(figures, "tasks_ratio", seconds["handed"] / seconds["scattered"])


def _unpickle(figures: dict[str, Any], moto: MotoS3, proxy: Nginx, client: Any, many: bytes, tensors: int,
              run_i: int) -> None:
    key = f"unpickled-{run_i}.pt"
    _put(moto, key, many)
    fs = _fs(moto, proxy, key)
    pickled = pickle.dumps(fs)
    index = tensors // 2
    path = f"model.layers.{index // 16}.mlp.w{index % 16}.weight"
    worker = sorted(client.scheduler_info()["workers"])[run_i % 2]
    mark = proxy.mark()
    loads, first_read = client.submit(unpickle_and_read, pickled, index, workers=[worker], pure=False).result()
    requests = proxy.since(mark, at_least=1)
    _put(moto, f"cat-{key}", many)  # an object of its own: the worker keeps the file system it unpickled above
    cat_pickled = pickle.dumps(_fs(moto, proxy, f"cat-{key}"))
    mark = proxy.mark()
    cat = client.submit(unpickle_and_cat, cat_pickled, path, workers=[worker], pure=False).result()
    cat_requests = proxy.since(mark, at_least=1)
    opened = client.submit(open_and_read, pickled, index, workers=[worker], pure=False).result()
    _add(figures, "unpickle_vs_open", (loads + first_read) / opened)
    _add(figures, "open_read_s", opened)
    _add(figures, "unpickle_s", loads)
    _add(figures, "unpickle_read_s", loads + first_read)
    _add(figures, "unpickle_cat_s", cat)
    _add(figures, "unpickle_opening_gets", sum(r.range.startswith("bytes=-") for r in requests + cat_requests))
    _add(figures, "unpickle_cat_requests", len(cat_requests))
    _add(figures, "unpickle_requests", len(requests))
    figures["pickle_bytes"] = len(pickled)


def _zarr(figures: dict[str, Any], moto: MotoS3, proxy: Nginx, client: Any, big: bytes, run_i: int) -> None:
    import dask.array as da
    import torch
    import zarr
    from fsspec.implementations.asyn_wrapper import AsyncFileSystemWrapper
    from zarr.storage import FsspecStore

    key = f"big-{run_i}.pt"
    _put(moto, key, big)
    tensor = torch.load(io.BytesIO(big))["big"]
    expected = tensor.double().sum().item()
    for chunk, name in (("4MiB", "slice"), ("1MiB", "sum")):
        fs = _fs(moto, proxy, key, zarr_chunk=chunk)
        store = FsspecStore(AsyncFileSystemWrapper(fs, asynchronous=True), path=".zarr", read_only=True)
        array = zarr.open_array(store, path="big", mode="r")
        mark = proxy.mark()
        if name == "slice":
            assert np.array_equal(array[0:2, 0:3], tensor.numpy()[0:2, 0:3])
            _add(figures, "zarr_slice_bytes", sum(r.sent for r in proxy.since(mark, at_least=1)))
        else:
            start = time.perf_counter()
            total = float(da.from_zarr(array).sum(dtype=np.float64).compute())
            _add(figures, "zarr_sum_s", time.perf_counter() - start)
            _add(figures, "zarr_sum_equal", abs(total - expected) <= 1e-6 * abs(expected) + 1e-3)
            _add(figures, "zarr_sum_fetched_ratio", sum(r.sent for r in proxy.since(mark, at_least=1))
                 / tensor.nbytes)


class _Counting:
    """A zarr store's reads counted (the calls zarr makes to fetch chunks, shard indexes and documents)."""

    def __init__(self, inner: Any) -> None:
        from zarr.abc.store import Store

        counting = self

        class Counted(type(inner)):  # type: ignore[misc]
            async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
                found = await super().get(key, prototype, byte_range)
                counting.reads += 1
                counting.bytes += 0 if found is None else len(found)
                return found

        assert isinstance(inner, Store)
        self.reads = 0
        self.bytes = 0
        self.store = Counted(inner.root, read_only=True)


def _sharding(figures: dict[str, Any], base: Path) -> None:
    import zarr
    from zarr.codecs import ShardingCodec
    from zarr.storage import LocalStore

    data = np.random.default_rng(7).standard_normal((16384, 1024), dtype=np.float32)
    _fresh(base)
    for layout in ("regular", "sharded"):
        options: dict[str, Any] = {"chunks": (256, 1024), "compressors": None}
        if layout == "sharded":
            options = {"shards": (16384, 1024), "chunks": (256, 1024), "compressors": None}
        written = zarr.create_array(LocalStore(base / layout), shape=data.shape, dtype=data.dtype, **options)
        written[...] = data
        keys = sum(1 for path in (base / layout).rglob("*") if path.is_file())
        counted = _Counting(LocalStore(base / layout))
        array = zarr.open_array(counted.store, mode="r")
        assert np.array_equal(array[0:2, 0:3], data[0:2, 0:3])
        slice_reads, slice_bytes = counted.reads, counted.bytes
        counted.reads = counted.bytes = 0
        start = time.perf_counter()
        assert np.array_equal(array[...], data)
        seconds = time.perf_counter() - start
        figures[f"sharding_{layout}"] = {"keys": keys, "slice_reads": slice_reads, "slice_bytes": slice_bytes,
                                         "whole_reads": counted.reads, "whole_bytes": counted.bytes,
                                         "whole_s": seconds}
    del ShardingCodec


def _median(figures: dict[str, Any], name: str) -> float:
    return float(statistics.median(figures[name]))


def table(f: dict[str, Any]) -> str:
    rows = [
        ("object replaced after the client opened it; worker reads",
         f"raised in {min(f['replaced_raised'])}/{f['replaced_workers'][0]} workers (every run), "
         f"{max(f['replaced_bytes_served'])} bytes of the new object served",
         "raises in every worker, 0 bytes of the new object served"),
        (f"{TASKS} tasks, each handed the client's file system, each reading one small tensor "
         f"({f['tensors']} tensors)",
         f"{max(f['tasks_handed_requests'])} requests (scattered: {max(f['tasks_scattered_requests'])}); "
         f"{_median(f, 'tasks_handed_s'):.2f} s vs {_median(f, 'tasks_scattered_s'):.2f} s scattered, "
         f"ratio {_median(f, 'tasks_ratio'):.2f}x (median of runs)",
         f"<= {TASKS} + 8 requests in all; wall time <= 1.3x the scattered pattern"),
        (f"unpickle plus first read in a worker, {f['tensors']}-tensor checkpoint",
         f"{_median(f, 'unpickle_read_s'):.3f} s (unpickle {_median(f, 'unpickle_s'):.3f} s; through a first "
         f"fs.cat_file instead: {_median(f, 'unpickle_cat_s'):.3f} s, {max(f['unpickle_cat_requests'])} requests); "
         f"opening GETs {max(f['unpickle_opening_gets'])}, {max(f['unpickle_requests'])} requests; pickle {f['pickle_bytes'] / MiB:.2f} MiB; "
         f"{_median(f, 'unpickle_vs_open'):.2f}x a new file system's open and read in the same worker "
         f"({_median(f, 'open_read_s'):.3f} s)",
         "<= 0.25 s, no opening GET"),
        ("a[0:2, 0:3] of a 64 MiB tensor through .zarr over ckpt://...::s3://",
         f"{max(f['zarr_slice_bytes']) / MiB:.2f} MiB fetched", "<= 8 MiB fetched"),
        ("from_zarr(...).sum() with 256-row chunks over the cluster",
         f"equal to torch: {all(f['zarr_sum_equal'])}; {max(f['zarr_sum_fetched_ratio']):.3f}x the tensor's bytes "
         f"fetched; {_median(f, 'zarr_sum_s'):.2f} s",
         "equal to torch; <= 1.25x the tensor's bytes fetched"),
    ]
    lines = ["distributed (LocalCluster(n_workers=2, processes=True); moto behind nginx)",
             "| figure | measured | target |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    regular, sharded = f["sharding_regular"], f["sharding_sharded"]
    lines += ["", "zarr-python on the same 64 MiB float32 array, 256-row (1 MiB) chunks: regular grid vs one shard",
              "| layout | keys | a[0:2, 0:3]: reads, bytes | whole array: reads, bytes, s |", "|---|---|---|---|"]
    for name, s in (("regular grid", regular), ("sharding_indexed", sharded)):
        lines.append(f"| {name} | {s['keys']} | {s['slice_reads']}, {s['slice_bytes']} | "
                     f"{s['whole_reads']}, {s['whole_bytes']}, {s['whole_s']:.3f} |")
    return "\n".join(lines)
