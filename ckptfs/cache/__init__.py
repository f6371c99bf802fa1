"""The metadata cache: a checkpoint's parse kept on disk, so that opening it again unchanged skips the pickle.

An entry is keyed by the source's identity and state (a file's device, inode, size, modification and change
times; a remote object's URL and version; a directory's and each of its files'), the entry format's version
and the ``Limits`` in force; any change is a miss (``source_keys``). It holds flat tables (no pickle), read
back with every size bounded and every value checked; a bad entry is removed and the checkpoint parsed.
Cached: torch.save zip, TorchScript, legacy, ``.pt2`` checkpoints and torch.distributed.checkpoint directories
with ``MIN_TENSORS`` tensors or more (``min_tensors``: more for some formats), local or at URLs whose store names the
object's version (ETag, generation, version id).
"""

from __future__ import annotations

import os
from pathlib import Path

from ckptfs.cache.entry_key import CACHED_FORMATS
from ckptfs.cache.errors import BadEntry, NotCacheable
from ckptfs.cache.source_keys import source_key
from ckptfs.cache.store import MetadataStore
from ckptfs.errors import CkptfsError
from ckptfs.formats.interface import ParsedCheckpoint
from ckptfs.gc_pause import gc_paused
from ckptfs.limits import Limits
from ckptfs.pickle import cscan, unpickler
from ckptfs.sources import ByteSource, LocalFileSource

MIN_TENSORS = 100
"""Below this, a parse takes a few milliseconds and an entry saves one or two (measured: docs/cli.md)."""
MIN_TENSORS_BY_FORMAT = {"pt2": 10_000}
"""Formats whose parse is cheaper per tensor: a ``.pt2``'s JSON configs parse at ~40 µs a tensor, and reading
an entry costs numpy's import first (~0.15 s), so below this an entry saves nothing (measured: docs/cli.md)."""
MIN_TENSORS_SCANNED = {"zip": 50_000}
"""The same for local files of formats the compiled scanner (``pickle.cscan``) parses when it is active: a
torch.save zip's parse then costs little more per tensor than an entry's reading, which costs numpy's import
first; below this an entry is slower than the parse (measured: scripts/bench_lib/README.md, issue 24). A remote
object's entry also saves the requests its parse makes, so it keeps ``MIN_TENSORS``."""


class MetadataCache:
    """Entries below ``cache_dir/metadata``."""

    def __init__(self, cache_dir: Path) -> None:
        self.store = MetadataStore(cache_dir)

    def load(self, source: ByteSource, limits: Limits) -> ParsedCheckpoint | None:
        """The cached parse of ``source``, or None (a miss, or a bad entry, then removed)."""
        key = source_key(source, limits)
        if key is None:
            return None
        data = self.store.read(key)
        if data is None:
            return None
        parsed = _decode(key, data, source, limits)
        if parsed is None:
            self.store.discard(key)
        return parsed

    @staticmethod
    def keeps(source: ByteSource, parsed: ParsedCheckpoint, tensors: int) -> bool:
        """Whether ``save`` writes an entry for this parse, unless the file changes meanwhile: not for a small one,
        nor one of another format."""
        return (tensors >= min_tensors(parsed.format, type(source) is LocalFileSource)
                and parsed.format in CACHED_FORMATS)

    def save(self, source: ByteSource, limits: Limits, parsed: ParsedCheckpoint, tensors: int) -> None:
        """Caches a parse (one that made a Checkpoint), unless it is small, of another format, or the file changed
        while it was parsed."""
        if not self.keeps(source, parsed, tensors):
            return
        key = source_key(source, limits)
        data = None if key is None else _encode(key, source, parsed)
        if data is not None and source_key(source, limits) == key:
            assert key is not None
            self.store.write(key, data)

    def discard(self, source: ByteSource, limits: Limits) -> None:
        key = source_key(source, limits)
        if key is not None:
            self.store.discard(key)


def min_tensors(fmt: str, local: bool) -> int:
    """The fewest tensors a checkpoint of format ``fmt`` (in a ``local`` file, or not) is cached with, on the parse
    path now active."""
    scanning = local and cscan.LIBRARY is not None and cscan.ENABLED and unpickler.FAST_PATHS
    return max(MIN_TENSORS, MIN_TENSORS_BY_FORMAT.get(fmt, 0), MIN_TENSORS_SCANNED.get(fmt, 0) if scanning else 0)


def encode_parse(source: ByteSource, limits: Limits, parsed: ParsedCheckpoint) -> bytes | None:
    """``parsed`` as an entry's bytes, to carry elsewhere (a pickled ``ckpt`` file system), whatever its size; None
    for a format or source the cache does not keep."""
    key = source_key(source, limits)
    return None if key is None else _encode(key, source, parsed)


def decode_parse(data: bytes, source: ByteSource, limits: Limits) -> ParsedCheckpoint | None:
    """The parse ``encode_parse`` made, if ``data`` checks as an entry for ``source`` as it is now (the same
    object version, file state and limits) and every value in it checks; else None: the source is parsed."""
    key = source_key(source, limits)
    return None if key is None else _decode(key, data, source, limits)


def _encode(key: str, source: ByteSource, parsed: ParsedCheckpoint) -> bytes | None:
    from ckptfs.cache.entry_file import encode_entry  # numpy: imported when there is an entry to write
    from ckptfs.cache.parsed_codec import encode_parsed

    if parsed.format not in CACHED_FORMATS:
        return None
    try:
        return encode_entry(key, encode_parsed(parsed, source))
    except NotCacheable:
        return None


def _decode(key: str, data: bytes, source: ByteSource, limits: Limits) -> ParsedCheckpoint | None:
    from ckptfs.cache.entry_file import decode_entry  # numpy: imported when there is an entry to read
    from ckptfs.cache.parsed_codec import decode_parsed

    try:
        with gc_paused():  # hundreds of thousands of long-lived records: nothing for the collector
            return decode_parsed(decode_entry(key, data), source, limits)
    except BadEntry:
        return None


def open_cache(cache_dir: str | os.PathLike[str] | None) -> MetadataCache | None:
    """The cache below ``cache_dir``; None without one, or when its folder cannot be made or is not ours (then
    checkpoints are parsed as without a cache)."""
    if cache_dir is None:
        return None
    try:
        return MetadataCache(Path(cache_dir))
    except CkptfsError:
        return None
