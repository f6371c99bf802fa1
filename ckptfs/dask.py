"""``ckptfs.dask``: a tensor of a checkpoint as a ``dask.array`` whose blocks are ranged reads (the ``dask`` extra).

::

    import ckptfs.dask
    w = ckptfs.dask.from_checkpoint("s3://bucket/model.pt", "model/embed.weight", chunks=4096)
    w[:10].compute()            # reads the first block's rows only
    w.sum().compute()           # each block one ranged read, on the workers

Blocks split the first axis (whole rows: each block is one contiguous range of the tensor's bytes; chunks that
also split other axes read their rows and slice them). The checkpoint is opened once, here; the graph holds its
``ckpt`` file system once (a pickle carrying the object's pinned version and the parse, ``fsspec.pickled``), so
a worker decodes the parse once and a replaced object raises ``ObjectChangedError`` rather than mixing versions.
Dtypes numpy lacks (bfloat16, float8 …) come as their raw bits (``uint16``, ``uint8``), as in the ``.npy`` views.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ckptfs.errors import CkptfsError, UnsupportedError
from ckptfs.fs.nodes import Dir, Kind
from ckptfs.fs.npy import npy_dtype
from ckptfs.fsspec.filesystem import CheckpointFileSystem
from ckptfs.model.records import Tensor

DEFAULT_BLOCK = 64 << 20
"""Bytes of a block when ``chunks`` is not given: whole rows, one ranged read each."""


def from_checkpoint(url_or_path: Any, key: str, chunks: Any = None, **options: Any) -> Any:
    """The tensor at ``key`` (its path in the checkpoint's tree, as ``ckptfs ls`` and ``ckpt://`` name it) of the
    checkpoint at ``url_or_path`` (a path or URL, or a ``CheckpointFileSystem`` already made) as a
    ``dask.array.Array``. ``chunks``: as dask takes them (a rows count splits the first axis only); default
    ``DEFAULT_BLOCK`` bytes of whole rows. ``options``: the ``CheckpointFileSystem``'s (``target_options``,
    ``limits``, ``cache_dir`` …)."""
    import dask.array as da
    from dask.base import tokenize

    fs = url_or_path if isinstance(url_or_path, CheckpointFileSystem) else CheckpointFileSystem(fo=url_or_path,
                                                                                                **options)
    node = fs._resolve(fs._strip_protocol(key), follow=True)
    if isinstance(node, Dir) or node.kind is not Kind.TENSOR:
        raise CkptfsError(f"{key} is not a tensor", fs.checkpoint.path)
    tensor: Tensor = node.value
    found = npy_dtype(tensor)
    if found is None:
        raise UnsupportedError(f"{key}: {tensor.dtype.name} has no numpy dtype nor raw bits to show",
                               fs.checkpoint.path)
    dtype = np.dtype(found[0])
    shape = tuple(tensor.shape)
    index = next(i for i, t in enumerate(fs.checkpoint.tensors) if t is tensor)
    row = tensor.nbytes // shape[0] if shape and shape[0] else 0
    if chunks is None:
        chunks = ((max(1, DEFAULT_BLOCK // row) if row else max(1, shape[0])),) + shape[1:] if shape else ()
    elif isinstance(chunks, int) and shape:
        chunks = (chunks,) + shape[1:]
    normal = da.core.normalize_chunks(chunks, shape, dtype=dtype)
    name = f"ckptfs-{tokenize(fs.checkpoint.path, getattr(fs.checkpoint.source, 'pinned', None), key, normal)}"
    fs_key = f"ckptfs-fs-{tokenize(id(fs), name)}"
    graph: dict[Any, Any] = {fs_key: fs}
    for block in np.ndindex(*[len(sizes) for sizes in normal]):
        bounds = [(sum(sizes[:at]), sum(sizes[: at + 1])) for sizes, at in zip(normal, block)]
        graph[(name, *block)] = (read_block, fs_key, index, bounds, dtype.str, shape)
    return da.Array(graph, name, normal, dtype=dtype)


def read_block(fs: CheckpointFileSystem, index: int, bounds: list[tuple[int, int]], dtype: str,
               shape: tuple[int, ...]) -> np.ndarray:
    """Rows ``bounds[0]`` of tensor ``index`` (one ranged read), sliced along the other axes as ``bounds`` says."""
    checkpoint = fs.checkpoint
    tensor = checkpoint.tensors[index]
    if tuple(tensor.shape) != shape or npy_dtype(tensor) is None or np.dtype(npy_dtype(tensor)[0]).str != dtype:
        raise CkptfsError(f"tensor {index} is not the one the array was made of", checkpoint.path)
    if not shape:
        return np.frombuffer(checkpoint.read(tensor), dtype=dtype).reshape(())
    first, last = bounds[0]
    row = tensor.nbytes // shape[0] if shape[0] else 0
    data = checkpoint.read(tensor, first * row, (last - first) * row) if row else b""
    rows = np.frombuffer(data, dtype=dtype).reshape((last - first,) + shape[1:])
    return rows[(slice(None),) + tuple(slice(start, stop) for start, stop in bounds[1:])]
