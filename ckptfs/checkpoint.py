"""``Checkpoint``: an opened checkpoint — its object tree, tensor records and reads."""

from __future__ import annotations

import copy
import os
from typing import TYPE_CHECKING, Any, Iterator

from ckptfs.background import run_in_background
from ckptfs.cache import MetadataCache, decode_parse, encode_parse, open_cache
from ckptfs.errors import CkptfsError, LimitExceededError, NotWritableError, UnsupportedError
from ckptfs.formats.detect import open_parsed
from ckptfs.formats.interface import ParsedCheckpoint
from ckptfs.gc_pause import gc_paused
from ckptfs.limits import Limits
from ckptfs.model.encoding import key_size
from ckptfs.model.records import Chunk, Key, Storage, Tensor, short_trail
from ckptfs.model.state_dict import state_dict
from ckptfs.model.trails import TrailCache
from ckptfs.model.tree import child_at, walk
from ckptfs.reading.extents import Extent, chunk_extents, stored_extents
from ckptfs.reading.storage import StorageReader
from ckptfs.reading.tensor import read_tensor
from ckptfs.sources import ByteSource, DirectorySource, RemoteOptions, hint_extents, open_source

if TYPE_CHECKING:
    import numpy as np

    from ckptfs.writing import TensorWriter


class Checkpoint:
    """A parsed checkpoint. Holds the source open; reads are ranged and thread-safe."""

    def __init__(self, source: ByteSource, parsed: ParsedCheckpoint, limits: Limits = Limits()) -> None:
        self.source = source
        self.limits = limits
        self.path = source.name
        self.format = parsed.format
        self.byteorder = parsed.byteorder
        self.details = parsed.details
        self.root = parsed.root
        self.storages: list[Storage] = parsed.storages
        self.tensors: list[Tensor] = []
        """Each distinct tensor record once, at its first place."""
        self.alias_count = 0
        """Other places of those records in the tree (tied weights: ``{"a": t, "b": t}`` has one tensor and one
        alias), a container met again counting as one place."""
        self._reader = StorageReader(source, parsed)
        self.writer: TensorWriter | None = None
        """Set by ``open_for_writing`` (``mode="r+"``)."""
        self._encoded: bytes | None | bool = False
        self._unsaved: MetadataCache | None = None
        """The metadata cache this parse is still to be written to (``open_checkpoint(save_later=True)``)."""
        self._collect_tensors(limits)
        hint_extents(source, ((s.offset, s.offset + s.nbytes) for s in self.storages
                              if s.source is source and s.offset >= 0 and not s.compressed))

    def _collect_tensors(self, limits: Limits) -> None:
        if type(self.root) is dict and self._collect_flat(self.root, limits):
            return
        # Each key once, and for every tensor and alias the path to it (its parent's keys and separators): what
        # ls, sidecars and the index spell beyond the keys, and what grows with depth.
        path_bytes = TrailCache(0, lambda size, key: size + key_size(key) + 2)
        key_bytes = 0
        for visit in walk(self.root, limits):
            trail = visit.trail
            if isinstance(visit.value, Tensor):
                if visit.first:
                    visit.value.trail = short_trail(trail)
                    self.tensors.append(visit.value)
                    if len(self.tensors) > limits.max_tensors:
                        raise LimitExceededError(f"more than {limits.max_tensors} tensors (limit max_tensors)")
                else:  # an alias
                    self.alias_count += 1
                if trail is not None:
                    key_bytes += path_bytes.value(trail[1])
            if trail is not None:
                key_bytes += key_size(trail[0])
            if key_bytes > limits.max_key_bytes:
                raise LimitExceededError(f"keys and tensor key paths total more than {limits.max_key_bytes} bytes "
                                         "(limit max_key_bytes)")

    def _collect_flat(self, root: dict[Key, Any], limits: Limits) -> bool:
        """``_collect_tensors`` for the common state dict, a dict of tensors only, in one pass without ``walk``:
        the same tensors, trails and totals. False (nothing done) for any other tree, or when a limit is
        exceeded, so that the walk raises its error where it would."""
        values = list(root.values())
        if set(map(type, values)) - {Tensor} or 1 + len(values) > limits.max_tree_nodes or limits.max_tree_depth < 1:
            return False
        keys = list(root)
        # At the root a tensor's path is its key: only the keys count (the walk's parents' paths are empty).
        key_bytes = sum(map(len, keys)) + 2 * len(keys) if set(map(type, keys)) == {str} else sum(map(key_size, keys))
        if len(set(values)) == len(values):  # no tensor met twice (records hash by identity)
            tensors = values
            for key, tensor in zip(keys, values):
                tensor.trail = key if type(key) is str else (key, None)
        else:
            seen: set[int] = set()
            tensors = []
            for key, tensor in zip(keys, values):
                if id(tensor) not in seen:
                    seen.add(id(tensor))
                    tensor.trail = key if type(key) is str else (key, None)
                    tensors.append(tensor)
        if len(tensors) > limits.max_tensors or key_bytes > limits.max_key_bytes:
            return False
        self.tensors = tensors
        self.alias_count = len(values) - len(tensors)
        return True

    def with_root(self, root: Any) -> Checkpoint:
        """The same checkpoint seen through another tree of tensor records it holds (``model.state_dict``'s), with
        ``tensors`` and their trails as that tree has them; reads, storages and the source are shared."""
        view = copy.copy(self)
        view.root = root
        view.tensors = []
        view.alias_count = 0
        view._collect_tensors(self.limits)
        return view

    def as_state_dict(self) -> Checkpoint:
        """A whole pickled ``nn.Module`` seen as its ``state_dict()`` (``model.state_dict``: torch's names, the same
        tensor records); any other checkpoint as it is."""
        try:
            named = state_dict(self.root, self.limits)
        except CkptfsError as exc:
            raise exc.with_path(self.path) from None
        return self if named is None else self.with_root(named)

    def __iter__(self) -> Iterator[Tensor]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    def tensor(self, path: tuple[Key, ...]) -> Tensor:
        """The tensor at ``path`` (any of its paths, if it is referenced more than once); KeyError if none."""
        value = self.root
        for key in path:
            value = child_at(value, key)
        if not isinstance(value, Tensor):
            raise KeyError(tuple(path))
        return value

    def read(self, tensor: Tensor, offset: int = 0, size: int | None = None) -> bytes:
        """The tensor's logical bytes in C order (those of ``t.contiguous()``), or a slice of them."""
        try:
            return read_tensor(self._reader, tensor, offset, size)
        except CkptfsError as exc:
            raise exc.with_path(self.path) from None

    def extents(self, tensor: Tensor) -> list[Extent] | None:
        """The source ranges holding the tensor's logical bytes as they are (its storage's framing checked),
        or None when its bytes must be gathered: see ``reading.extents``."""
        if tensor.chunks is not None:
            try:
                return chunk_extents(tensor, lambda chunk: self._checked_chunk(tensor, chunk))
            except CkptfsError as exc:
                raise exc.with_path(self.path) from None
        extents = stored_extents(tensor)
        if extents is not None:
            assert tensor.storage is not None
            try:
                self._reader.verify(tensor.storage)
            except CkptfsError as exc:
                raise exc.with_path(self.path) from None
        return extents

    def _checked_chunk(self, tensor: Tensor, chunk: Chunk) -> Tensor:
        inner = self._reader.parsed.chunk_tensor(chunk, tensor.dtype.name)
        if inner.storage is not None:
            self._reader.verify(inner.storage)
        return inner

    def to_numpy(self, tensor: Tensor) -> np.ndarray:
        """A numpy array of the tensor (a copy), for dtypes numpy has."""
        if tensor.numpy_dtype is None:
            raise UnsupportedError(f"numpy has no dtype for {tensor.dtype.name}", self.path)
        if tensor.dtype.packing > 1:
            raise UnsupportedError(f"{tensor.dtype.name} is packed; read() gives its bytes", self.path)
        import numpy as np

        data = self.read(tensor)
        return np.frombuffer(data, dtype=tensor.numpy_dtype).reshape(tensor.shape).copy()

    def open_for_writing(self) -> None:
        """Lets ``write`` write tensors' bytes into the file in place; NotWritableError saying why it cannot."""
        from ckptfs.writing import TensorWriter, refusal_of_archive  # here: its threads and isal serve writes only

        parsed = self._reader.parsed
        refusal = refusal_of_archive(parsed, self.source)
        if refusal is not None:
            raise NotWritableError(f"cannot be opened for writing: {refusal}", self.path)
        self.writer = TensorWriter(self.path, parsed, self.tensors, self._reader.verify)  # type: ignore[arg-type]

    def write(self, tensor: Tensor, data: bytes | bytearray | memoryview, offset: int = 0) -> int:
        """Writes ``data`` at byte ``offset`` of the tensor's bytes in the file (``mode="r+"``): all of it, or none
        (NotWritableError: the tensor is read-only; WritePastEndError: past its end). The record's CRC-32 is set
        once all of its bytes are written, at ``sync`` or ``close``."""
        if self.writer is None:
            raise NotWritableError("opened read-only (ckptfs.open(path, mode='r+') writes)", self.path)
        return self.writer.write(tensor, data, offset)

    def sync(self) -> None:
        """Sets the CRC-32 of every record whose bytes are all written, and puts the file on the disk."""
        if self.writer is not None:
            self.writer.sync()

    def encoded_parse(self) -> bytes | None:
        """The parse in the metadata cache's encoding (made once), which ``open_checkpoint(parse=)`` takes back
        for this source at this version; None for what the cache does not keep."""
        if self._encoded is False:
            self._encoded = encode_parse(self.source, self.limits, self._reader.parsed)
        return self._encoded  # type: ignore[return-value]

    def save_parse(self) -> None:
        """Writes the parse to the metadata cache, if it was opened with ``save_later`` and parsed (not read from the
        cache); once."""
        cache, self._unsaved = self._unsaved, None
        if cache is not None:
            cache.save(self.source, self.limits, self._reader.parsed, len(self.tensors))

    def save_parse_in_background(self) -> None:
        """``save_parse`` from a process of its own, detached and niced, that the caller does not wait for: writing
        an entry costs about as much as the parse, and a mount or a listing is done without it. Not at all where no
        process can be made: the next open parses and writes it."""
        if self._unsaved is None:
            return

        def save() -> None:
            self.source.reopen()  # what a source cannot share across a fork is made anew
            self.save_parse()

        run_in_background(save)
        self._unsaved = None

    def close(self) -> None:
        try:
            if self.writer is not None:
                self.writer.close()
        finally:
            self.source.close()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Checkpoint {self.path!r} {self.format} {len(self.tensors)} tensors>"


def open_checkpoint(path: str | os.PathLike[str] | ByteSource, limits: Limits = Limits(),
                    remote: RemoteOptions = RemoteOptions(),
                    cache_dir: str | os.PathLike[str] | None = None, mode: str = "r",
                    parse: bytes | None = None, save_later: bool = False) -> Checkpoint:
    """Parses a checkpoint's metadata; no tensor data is read. ``path`` may be a URL (s3://, http(s)://, any
    fsspec URL), reached as ``remote`` says. With ``cache_dir``, the parse is kept there and the next open of
    the unchanged file, directory or object version reads it instead of the pickle (``ckptfs.cache``). ``mode="r+"``
    opens a local torch.save zip for ``Checkpoint.write`` too (NotWritableError saying why not). The cyclic
    garbage collector is paused meanwhile: its passes over the records being made, which all live on, cost 10-12%
    of a parse. ``parse``: a ``Checkpoint.encoded_parse()`` of this source: used, instead of parsing, when it checks
    for the source as it is now (``cache.decode_parse``). ``save_later``: a parse is written to the cache only by
    ``Checkpoint.save_parse`` or ``save_parse_in_background`` (a mount once it is mounted, ``ckptfs ls`` once it has
    listed)."""
    if mode not in ("r", "r+"):
        raise UnsupportedError(f"mode {mode!r}: expected 'r' or 'r+'", str(path))
    if hasattr(path, "read") and hasattr(path, "size"):
        source = path
    elif os.path.isdir(path):
        source = DirectorySource(path)
    else:
        source = open_source(path, remote)
    try:
        with gc_paused():
            # Writing trusts no cached or carried parse: it needs every record's framing as the file holds it now.
            writing = mode == "r+"
            checkpoint = _open(source, limits, open_cache(None if writing else cache_dir),  # type: ignore[arg-type]
                               None if writing else parse, save_later)
        if writing:
            try:
                checkpoint.open_for_writing()
            except BaseException:
                checkpoint.close()
                raise
        return checkpoint
    except CkptfsError as exc:
        source.close()  # type: ignore[union-attr]
        raise exc.with_path(source.name) from None  # type: ignore[union-attr]
    except BaseException:
        source.close()  # type: ignore[union-attr]
        raise


def _open(source: ByteSource, limits: Limits, cache: MetadataCache | None, carried: bytes | None,
          save_later: bool) -> Checkpoint:
    if carried is not None:
        decoded = decode_parse(carried, source, limits)
        if decoded is not None:
            try:
                return Checkpoint(source, decoded, limits)
            except CkptfsError:  # a tree the parse would not have made: parsed below
                pass
    if cache is not None:
        cached = cache.load(source, limits)
        if cached is not None:
            try:
                return Checkpoint(source, cached, limits)
            except CkptfsError:  # a tree the parse would not have made: the entry lied
                cache.discard(source, limits)
    parsed = open_parsed(source, limits)
    checkpoint = Checkpoint(source, parsed, limits)
    if cache is not None and cache.keeps(source, parsed, len(checkpoint.tensors)):
        checkpoint._unsaved = cache
    if not save_later:
        checkpoint.save_parse()
    return checkpoint
