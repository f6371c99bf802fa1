"""How a ``ckpt`` file system travels in a pickle (to Dask workers, Ray tasks, subprocesses).

fsspec pickles a file system as its constructor's arguments, so each copy opened the checkpoint again: the object
as it was then (not the version the client read, with no error when it was replaced) and a full parse. A ``ckpt``
file system's pickle also carries what its open found:

* the pinned version of a remote object (size, ETag, version id, Last-Modified): the copy opens it without a
  request and every read asks for that version, so a replaced object raises ``ObjectChangedError`` in every copy;
* the parse, in the metadata cache's own encoding (``ckptfs.cache``: flat tables, a digest, the key of the object
  version and the limits, every value checked on decode; nothing in it is executed): the copy decodes it instead
  of reading the pickle of the checkpoint, or parses when it does not check (another version or file state).

Copies unpickled in one process share one file system per (arguments, pinned version): every task handed the
same file system costs one decode per worker process, not one per task. Credentials in the target's options
travel in the pickle, as with every fsspec file system.
"""

from __future__ import annotations

import atexit
import os
import threading
import zlib
from typing import Any, NamedTuple

from fsspec.utils import tokenize

from ckptfs.limits import Limits

ENTRY_PER_PICKLE_BYTE = 4
"""An entry is about the size of the pickle it was parsed from (a 20,000-tensor zip: 2.1 MB against 2.4 MB): one
inflating past this many bytes per ``max_pickle_bytes`` is not an entry."""
RESTORED_KEPT = 16
"""File systems unpickled in a process kept for the next copies of them (most recently made first)."""
_restored: dict[str, Any] = {}
_lock = threading.Lock()
_pid = os.getpid()
atexit.register(_restored.clear)  # closed while the interpreter can still run their __del__


class Carried(NamedTuple):
    """What a pickled ``ckpt`` file system carries besides its arguments (``CheckpointFileSystem(_carried=)``)."""

    pinned: tuple[int, str | None, str | None, int | None] | None
    parse: bytes | None
    """The parse's entry (``Checkpoint.encoded_parse``) deflated: a 20,000-tensor zip's 2.1 MB entry is 0.38 MB,
    made once per file system in 15 ms and inflated once per process."""

    @staticmethod
    def pack(entry: bytes | None) -> bytes | None:
        return None if entry is None else zlib.compress(entry, 1)

    def unpacked(self, limits: Limits) -> bytes | None:
        """The entry, or None when it does not inflate within what an entry of a checkpoint within ``limits``
        may take (it is then parsed)."""
        if self.parse is None:
            return None
        inflater = zlib.decompressobj()
        try:
            entry = inflater.decompress(self.parse, limits.max_pickle_bytes * ENTRY_PER_PICKLE_BYTE)
        except zlib.error:
            return None
        return entry if inflater.eof and not inflater.unconsumed_tail else None

    def __repr__(self) -> str:  # fsspec tokenizes arguments by their text: not the parse's megabytes
        return f"Carried(pinned={self.pinned!r}, parse={0 if self.parse is None else len(self.parse)} bytes)"


def restore(cls: type, args: tuple[Any, ...], options: dict[str, Any], carried: Carried) -> Any:
    """The file system a pickle names: the one this process already made of it, or a new one opened as it says."""
    global _pid
    token = tokenize(cls, args, options, carried.pinned)
    with _lock:
        if os.getpid() != _pid:  # forked: the parent's connections are not ours
            _restored.clear()
            _pid = os.getpid()
        found = _restored.get(token)
    if found is not None:
        return found
    made = cls(*args, _carried=carried, **options)
    with _lock:
        found = _restored.setdefault(token, made)
        while len(_restored) > RESTORED_KEPT:
            del _restored[next(iter(_restored))]
    return found
