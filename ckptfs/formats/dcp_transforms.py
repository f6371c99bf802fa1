"""Encoded DCP items: the ZStandard extension (``stream.zstd/1``), one zstd frame around each item's blob.

The frame declares no content size and has no seek table, and a zstd
decoder's state cannot be copied, so a byte at offset N of the blob costs
decompressing N bytes from the frame's start. ``ZstdBlobSource`` therefore
decompresses once to learn the size, and keeps what it decompressed: the most
recently used blobs whole in memory, together at most ``MAX_HELD_BYTES`` (or
``max_inflated_bytes`` if lower); a larger blob in an unnamed temporary file
under the user's cache directory (``$XDG_CACHE_HOME/ckptfs``, ``~/.cache/ckptfs``),
the checkpoint's such files together at most ``SPILL_BYTES``, and never filling
the disk past ``SPILL_FREE_BYTES``. A blob that fits neither is streamed from the
start for every read, keeping only the requested bytes. No decoder call makes
more than 64 MiB, so that one call cannot inflate a tiny frame into gigabytes. The decoder is the
standard library's ``compression.zstd`` (Python 3.14 on), else the ``zstandard`` wheel, a dependency below
3.14. docs/formats.md: "DCP directories".
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections import OrderedDict
from typing import IO, Any, Callable, Iterator

from ckptfs.errors import CorruptCheckpointError, SourceError, UnsupportedError
from ckptfs.limits import Limits
from ckptfs.sources import ByteSource, SourceStat

ZSTD = "stream.zstd/1"
STREAM_READ = 1 << 20
"""Compressed bytes read from the frame at a time."""
FEED = 2048
"""Compressed bytes given to ``zstandard``'s decoder in one call: zstd inflates at most ~32768:1 (a run-length
block), so a call makes at most 64 MiB."""
MAX_HELD_BYTES = 256 << 20
"""Decompressed blobs kept in memory, together."""
SPILL_BYTES = 64 << 30
"""Decompressed blobs of one checkpoint kept in temporary files, together."""
SPILL_FREE_BYTES = 1 << 30
"""Space a spill file leaves free on its file system."""
MAX_EXPANSION = 1 << 16
"""A zstd block inflates at most ~1:32768 plus framing; anything beyond this is refused as hostile."""
ARCHIVE_OVERHEAD = 1 << 20
"""Bytes a chunk's torch.save archive may hold besides the chunk's data (records, pickle, padding)."""


class RecentBlobs:
    """The decompressed blobs a checkpoint keeps in memory, the most recently used, together at most ``budget``
    bytes (a window of a tensor split along a later dimension reads from every chunk)."""

    def __init__(self, budget: int) -> None:
        self.budget = min(budget, MAX_HELD_BYTES)
        self._blobs: OrderedDict[int, tuple[object, bytes]] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()
        self.spilled = 0
        """Bytes of this checkpoint's blobs in spill files."""

    def get(self, owner: object) -> bytes | None:
        with self._lock:
            held = self._blobs.get(id(owner))
            if held is None or held[0] is not owner:
                return None
            self._blobs.move_to_end(id(owner))
            return held[1]

    def put(self, owner: object, data: bytes) -> None:
        with self._lock:
            old = self._blobs.pop(id(owner), None)
            self._size -= len(old[1]) if old is not None else 0
            while self._blobs and self._size + len(data) > self.budget:
                self._size -= len(self._blobs.popitem(last=False)[1][1])
            self._blobs[id(owner)] = (owner, data)
            self._size += len(data)


def decoded_blob(blob: ByteSource, transforms: tuple[str, ...], limits: Limits, recent: RecentBlobs,
                 data_bytes: int | None) -> ByteSource:
    """The item's blob with its encodings undone (only the ZStandard extension is known). ``data_bytes``: the
    size of the tensor data it holds, when known (a chunk), which bounds its decompressed size."""
    if transforms != (ZSTD,):
        raise UnsupportedError(f"item encoded as {list(transforms)}; ckptfs reads only [{ZSTD!r}]")
    ceiling = max(blob.size, 1) * MAX_EXPANSION
    if data_bytes is not None:
        ceiling = min(ceiling, data_bytes + ARCHIVE_OVERHEAD)
    return ZstdBlobSource(blob, limits, recent, ceiling)


def zstd_decoder() -> tuple[Callable[[], Any], tuple[type[Exception], ...]]:
    """What makes a one-frame decoder (``pieces(data)``, ``eof``), and the errors it raises on a bad frame:
    ``compression.zstd`` where Python has it, else ``zstandard``."""
    try:
        from compression import zstd  # type: ignore[import-not-found]
    except ImportError:
        try:
            import zstandard
        except ImportError:
            raise UnsupportedError("the checkpoint was saved with the ZStandard extension, and this Python has "
                                   "neither compression.zstd nor the zstandard package that ckptfs depends on: "
                                   "reinstall ckptfs") from None
        return (lambda: _WheelDecoder(zstandard)), (zstandard.ZstdError,)
    # Its decoder raises EOFError for bytes fed past the frame's end, where zstandard's raises ZstdError.
    return (lambda: _StdlibDecoder(zstd)), (zstd.ZstdError, EOFError)


class _WheelDecoder:
    """``zstandard``'s decoder: each call's output in one piece, so it is fed ``FEED`` bytes at a time."""

    feed = FEED

    def __init__(self, zstandard: Any) -> None:
        self._decoder = zstandard.ZstdDecompressor().decompressobj()

    @property
    def eof(self) -> bool:
        return bool(self._decoder.eof)

    def pieces(self, data: memoryview) -> Iterator[bytes]:
        yield self._decoder.decompress(data)


class _StdlibDecoder:
    """``compression.zstd``'s decoder, its output taken ``STREAM_READ`` bytes at a time whatever it is fed (a call
    without that bound grows one buffer to its whole output), so it is fed what is read at once."""

    feed = STREAM_READ

    def __init__(self, zstd: Any) -> None:
        self._decoder = zstd.ZstdDecompressor()

    @property
    def eof(self) -> bool:
        return bool(self._decoder.eof)

    def pieces(self, data: memoryview) -> Iterator[bytes]:
        yield self._decoder.decompress(data, STREAM_READ)
        while not self._decoder.eof and not self._decoder.needs_input:
            yield self._decoder.decompress(b"", STREAM_READ)


class ZstdBlobSource:
    """A zstd frame's decompressed bytes as a source, decompressed on demand (see the module docstring)."""

    def __init__(self, frame: ByteSource, limits: Limits, recent: RecentBlobs, ceiling: int) -> None:
        self.frame = frame
        self.name = f"{frame.name} (zstd)"
        self.limits = limits
        self._decoder, self._errors = zstd_decoder()
        self._recent = recent
        self.ceiling = ceiling
        """Most bytes the frame may decompress to; more is refused as hostile."""
        if frame.size < 4 or frame.read(0, 4) != b"\x28\xb5\x2f\xfd":
            raise CorruptCheckpointError(f"marked {ZSTD} but not a zstd frame")
        self._spill: IO[bytes] | None = None
        """The decompressed blob in a temporary file, when it is larger than the memory budget."""
        self.size = self._scan()

    def _chunks(self) -> Any:
        """Decompressed pieces of the frame, from its start."""
        decoder = self._decoder()
        produced = 0
        try:
            for position in range(0, self.frame.size, STREAM_READ):
                read = memoryview(self.frame.read(position, min(STREAM_READ, self.frame.size - position)))
                for start in range(0, len(read), decoder.feed):
                    for piece in decoder.pieces(read[start : start + decoder.feed]):
                        produced += len(piece)
                        if produced > self.ceiling:
                            raise CorruptCheckpointError(f"zstd frame decompresses to more than {self.ceiling} "
                                                         "bytes, more than its item can hold")
                        if piece:
                            yield piece
        except self._errors as exc:
            raise CorruptCheckpointError(f"zstd frame is corrupt ({exc})") from None
        if not decoder.eof:
            raise CorruptCheckpointError("zstd frame is truncated")

    def _scan(self) -> int:
        """The decompressed size; the bytes kept as the recent blob when within the memory budget, else in a spill
        file when there is room for one."""
        parts: list[bytes] | None = []
        spill: IO[bytes] | None = None
        size = 0
        for piece in self._chunks():
            size += len(piece)
            if parts is not None:
                parts.append(piece)
                if size > self._recent.budget:
                    spill = self._spill_file()
                    if spill is not None:
                        spill.writelines(parts)
                    parts = None
            elif spill is not None:
                if self._recent.spilled + size > SPILL_BYTES:
                    spill.close()
                    spill = None
                else:
                    spill.write(piece)
        if parts is not None:
            self._recent.put(self, b"".join(parts))
        if spill is not None:
            spill.flush()
            self._recent.spilled += size
        self._spill = spill
        return size

    def _spill_file(self) -> IO[bytes] | None:
        """An unnamed temporary file under the user's cache directory, or None where none can be made or the
        checkpoint's spill files are at their budget."""
        if self._recent.spilled + self._recent.budget > SPILL_BYTES:
            return None
        directory = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ckptfs")
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            disk = os.statvfs(directory)
            if disk.f_bavail * disk.f_frsize < SPILL_FREE_BYTES + self.ceiling:
                return None
            return tempfile.TemporaryFile(dir=directory, prefix="zstd-")
        except OSError:
            return None

    def read(self, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise SourceError(f"read of {length} bytes at offset {offset} is outside the decompressed item "
                              f"({self.size} bytes)", self.name)
        if self._spill is not None:
            return _pread(self._spill.fileno(), offset, length, self.name)
        data = self._recent.get(self)
        if data is None and self.size <= self._recent.budget:
            data = b"".join(self._chunks())
            self._recent.put(self, data)
        if data is not None:
            return data[offset : offset + length]
        return self._stream(offset, length)

    def _stream(self, offset: int, length: int) -> bytes:
        parts = []
        position = 0
        end = offset + length
        for piece in self._chunks():
            if position + len(piece) > offset:
                parts.append(piece[max(0, offset - position) : end - position])
            position += len(piece)
            if position >= end:
                break
        return b"".join(parts)

    def fileno(self) -> int | None:
        return None

    def stat(self) -> SourceStat | None:
        return self.frame.stat()

    def reopen(self) -> None:
        """Nothing to do: the frame's file is reopened by its owner."""

    def close(self) -> None:
        """Nothing to do: the recent blob belongs to the checkpoint."""


def _pread(fd: int, offset: int, length: int, name: str) -> bytes:
    parts, got = [], 0
    try:
        while got < length:
            part = os.pread(fd, length - got, offset + got)
            if not part:
                break
            parts.append(part)
            got += len(part)
    except OSError as exc:
        raise SourceError(f"read of the decompressed item's spill file failed: {exc.strerror}", name) from None
    if got != length:
        raise SourceError(f"the decompressed item's spill file ended after {got} of {length} bytes", name)
    return b"".join(parts)
