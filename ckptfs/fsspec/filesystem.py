"""``CheckpointFileSystem``: a checkpoint as a read-only fsspec file system, the tree its mount shows.

Like fsspec's ``zip`` and ``tar`` (an archive file system): ``fo`` names the
checkpoint, read through ``target_protocol`` with ``target_options``, so URLs
chain::

    fs = fsspec.filesystem("ckpt", fo="model.pt")
    fs.ls("")                                  # what the mount's root lists
    fs.cat_file("model/embed.weight", 0, 64)   # a ranged read of a tensor's bytes
    fsspec.open("ckpt://model/embed.weight::/data/model.pt").open().read()

Paths are the mount's, relative to its root, every file the mount shows
(tensors, values, the views beside each tensor, ``.ckptfs/index.json``),
made from the same ``Layout`` and read through the same pieces: a tensor
stored as it is is a ranged read of the source, nothing is read before it
is asked for. Links (an object met again) are entries with ``islink`` and
their ``destination`` path: a link to a tensor or a view is a file of its
target's size and reads as it; a link to a directory has type ``link``
(``ls`` of it lists its target), so that ``find`` and ``walk`` visit each
directory once, as ``find`` does in a mount.
"""

from __future__ import annotations

import errno
import os
from functools import cached_property
from typing import Any, Collection

from fsspec.archive import AbstractArchiveFileSystem
from fsspec.spec import AbstractBufferedFile

from ckptfs.checkpoint import open_checkpoint
from ckptfs.errors import CkptfsError
from ckptfs.fs.layout import Layout
from ckptfs.fs.nodes import Dir, Kind, Node
from ckptfs.fs.pieces import Content, read_content
from ckptfs.fs.resolve import LINK_KINDS, link_path, resolve
from ckptfs.fs.views import VIEW_NAMES, view_names
from ckptfs.fs.zarr import ZARR_CHUNK
from ckptfs.fsspec.pickled import Carried, restore
from ckptfs.fsspec.targets import target_source
from ckptfs.limits import Limits, parse_quantity
from ckptfs.model.records import Tensor


class CheckpointFileSystem(AbstractArchiveFileSystem):
    """A checkpoint's tree as a read-only fsspec file system (protocol ``ckpt``)."""

    protocol = "ckpt"
    root_marker = ""
    cachable = False
    """Like ``zip`` and ``tar``: each instance made opens the checkpoint it is given, as it is then. Unpickled copies
    of one instance are shared in a process instead (``pickled``): they read the version it opened."""

    def __init__(self, fo: Any = "", target_protocol: str | None = None, target_options: dict[str, Any] | None = None,
                 limits: Limits | None = None, views: Collection[str] = VIEW_NAMES, nest: bool = False,
                 cache_dir: str | os.PathLike[str] | None = None, zarr_chunk: int | str = ZARR_CHUNK,
                 _carried: Carried | None = None,
                 **kwargs: Any) -> None:
        """``fo``: the checkpoint, a path or URL (read through ``target_protocol`` and ``target_options``, as
        ``fsspec.open`` would: ``fsspec.targets``), an open binary file or a ``ckptfs.sources.ByteSource``;
        ``limits``: the safety limits (``ckptfs.Limits``); ``views``: the views shown (``json``, ``npy``,
        ``q_scales``, ``q_zero_points``, ``safetensors``, ``zarr``; default all), as a list or a comma-separated
        text; ``nest``: dicts' dotted keys as directories, as ``ckptfs mount --nest``; ``cache_dir``: the metadata
        cache's folder (as ``ckptfs --cache-dir``; default none): an unchanged checkpoint opened again is read from
        there instead of parsed; ``zarr_chunk``: bytes of a ``.zarr`` array's chunk (an int or ``"4MiB"``; whole
        rows, 0: one chunk an array, as ``-o zarr_chunk``). ``_carried``: what a pickle of another instance
        carries (``pickled``). The tree (``layout``) is made on first use: a task reading tensors through
        ``checkpoint`` (``ckptfs.dask``) never makes it."""
        super().__init__(**kwargs)
        self.fo = fo
        limits = limits or Limits()
        parse = None if _carried is None else _carried.unpacked(limits)
        self.checkpoint = open_checkpoint(target_source(fo, target_protocol, target_options,
                                                        None if _carried is None else _carried.pinned),
                                          limits, cache_dir=cache_dir, parse=parse)
        self._tree = (view_names(_view_list(views)), nest,
                      parse_quantity(zarr_chunk) if isinstance(zarr_chunk, str) else int(zarr_chunk))
        self._packed: bytes | None = None

    @cached_property
    def layout(self) -> Layout:
        views, nest, zarr_chunk = self._tree
        return Layout(self.checkpoint, views=views, nest=nest, zarr_chunk=zarr_chunk)

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        """Paths are relative to the checkpoint's root, as in the mount."""
        stripped = super()._strip_protocol(path)
        return [p.lstrip("/") for p in stripped] if isinstance(stripped, list) else stripped.lstrip("/")

    # -- the tree ----------------------------------------------------------------

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        path = self._strip_protocol(path)
        node = self._resolve(path, follow=True)
        if not isinstance(node, Dir):
            entries = [self.info(path)]
        else:
            nodes = self.layout.listing(node)
            base = path + "/" if path else ""
            entries = [self._entry(base + shown.name, shown, size) for shown, size in zip(nodes, self._sizes(nodes))]
        return entries if detail else [entry["name"] for entry in entries]

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        path = self._strip_protocol(path)
        node = self._resolve(path, follow=False)
        return self._entry(path, node, self._sizes([node])[0])

    def _entry(self, name: str, node: Node, size: int) -> dict[str, Any]:
        if isinstance(node, Dir):
            return {"name": name, "size": 0, "type": "directory", "kind": node.kind.value}
        if node.kind in LINK_KINDS:
            destination = self._link_path(node)
            target = self._resolve(destination, follow=True)
            if isinstance(target, Dir):
                return {"name": name, "size": 0, "type": "link", "kind": node.kind.value, "islink": True,
                        "destination": destination}
            return {"name": name, "size": self._sizes([target])[0], "type": "file", "kind": node.kind.value,
                    "islink": True, "destination": destination}
        entry = {"name": name, "size": size, "type": "file", "kind": node.kind.value}
        if node.kind is Kind.TENSOR:
            tensor: Tensor = node.value
            entry.update(dtype=tensor.dtype.name, shape=list(tensor.shape))
        return entry

    def _sizes(self, nodes: list[Node]) -> list[int]:
        """File sizes; one whose text cannot be made (a limit) lists as 0, as in the mount, and fails when read."""
        try:
            return self.layout.sizes(nodes)
        except CkptfsError:
            return [self._size_or_zero(node) for node in nodes]

    def _size_or_zero(self, node: Node) -> int:
        try:
            return self.layout.size(node)
        except CkptfsError:
            return 0

    def _resolve(self, path: str, follow: bool) -> Node:
        return resolve(self.layout, path, follow)

    def _link_path(self, node: Node) -> str:
        return link_path(self.layout, node)

    # -- reading -----------------------------------------------------------------

    def _content(self, path: str) -> Content:
        node = self._resolve(self._strip_protocol(path), follow=True)
        if isinstance(node, Dir):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        return Content(self.layout.pieces(node), self.layout.size(node))

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        """Bytes ``[start, end)`` of the file (negative: from its end, as slices), read from the pieces holding them."""
        content = self._content(path)
        first, last, _ = slice(start, end).indices(content.size)
        return read_content(self.checkpoint, content, first, max(0, last - first))

    def _open(self, path: str, mode: str = "rb", block_size: Any = None, autocommit: bool = True,
              cache_options: dict[str, Any] | None = None, **kwargs: Any) -> CheckpointFile:
        if mode != "rb":
            raise OSError(errno.EROFS, f"{os.strerror(errno.EROFS)}: a checkpoint opens for reading only", path)
        return CheckpointFile(self, path, self._content(path), block_size, cache_options)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled with the version its source pinned and its parse (``pickled``)."""
        options = {key: value for key, value in self.storage_options.items() if key != "_carried"}
        if self._packed is None:
            self._packed = Carried.pack(self.checkpoint.encoded_parse())
        carried = Carried(getattr(self.checkpoint.source, "pinned", None), self._packed)
        return restore, (type(self), self.storage_args, options, carried)

    def close(self) -> None:
        """Closes the checkpoint's source (also when the file system is garbage-collected)."""
        if hasattr(self, "checkpoint"):
            self.checkpoint.close()

    def __del__(self) -> None:
        self.close()


class CheckpointFile(AbstractBufferedFile):
    """A file of the checkpoint; each block fsspec's cache asks for is one read of the pieces holding it."""

    def __init__(self, fs: CheckpointFileSystem, path: str, content: Content, block_size: Any = None,
                 cache_options: dict[str, Any] | None = None) -> None:
        self.content = content
        super().__init__(fs, path, mode="rb", block_size=block_size or "default", cache_options=cache_options,
                         size=content.size)

    def _fetch_range(self, start: int, end: int) -> bytes:
        return read_content(self.fs.checkpoint, self.content, start, end - start)


def _view_list(views: Collection[str]) -> Collection[str]:
    """Views as a list or a comma-separated text (a URL's or a configuration file's storage option)."""
    return [name for name in views.split(",") if name] if isinstance(views, str) else views
