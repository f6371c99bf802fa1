"""What ``ckptfs diff`` finds: two checkpoints' tensors, paired by ``diff_match``, compared a chunk at a time.

A pair whose dtype, shape or kind
differs is reported without reading anything. Otherwise both tensors'
logical bytes are read in chunks of at most ``CHUNK_ELEMENTS`` elements on a
thread pool (at most ``2 * threads`` chunks in flight: memory stays bounded)
and compared as bytes (not hashed: both sides must be read anyway, and comparing
costs less than any hash); only chunks that differ are converted to float64 (or
complex128) for the largest absolute and relative difference. ``quick`` reads
no further chunks of a tensor once one differs. A pair of tensors met again
(tied weights) is compared once; two tensors stored at the same place of the
same file (``diff x.pt x.pt``) are equal without reading them.
"""

from __future__ import annotations

import collections
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from ckptfs.checkpoint import Checkpoint
from ckptfs.cli.diff_match import Entry
from ckptfs.errors import CkptfsError
from ckptfs.model.records import Tensor
from ckptfs.sources import ByteSource

if TYPE_CHECKING:
    import numpy as np

CHUNK_ELEMENTS = 1 << 20
"""Elements compared at a time: two float64 copies of a chunk are 16 MiB."""


@dataclass(slots=True)
class Outcome:
    """One pair's result: ``status`` is only_in_a, only_in_b, changed, equal, differ or error."""

    place_a: Entry | None
    place_b: Entry | None
    status: str = "equal"
    differing: int = 0
    """Elements whose bytes differ (in the chunks read: all of them unless ``partial``)."""
    max_abs: float | complex | None = None
    max_rel: float | None = None
    partial: bool = False
    """``quick`` stopped reading at the first chunk that differs."""
    error: str | None = None

    @property
    def a(self) -> Tensor | None:
        return None if self.place_a is None else self.place_a.tensor

    @property
    def b(self) -> Tensor | None:
        return None if self.place_b is None else self.place_b.tensor

    @property
    def place(self) -> Entry:
        """A's place, else B's."""
        place = self.place_a or self.place_b
        assert place is not None
        return place


@dataclass(slots=True)
class ChunkResult:
    differing: int = 0
    max_abs: float | None = None
    max_rel: float | None = None


class Comparison:
    """Compares the tensors of two opened checkpoints, pairs of their places (``diff_match.paired``)."""

    def __init__(self, a: Checkpoint, b: Checkpoint, quick: bool = False, threads: int = 4) -> None:
        self.a, self.b, self.quick, self.threads = a, b, quick, max(1, threads)
        self.bytes_read = 0
        self.compared = 0
        """Tensors whose bytes are compared so far (of ``to_compare``): the progress line shows them."""
        self.to_compare = 0
        self._last: Outcome | None = None
        self._lock = threading.Lock()

    def progress(self) -> str:
        read = self.bytes_read / (1 << 20)
        return f"comparing tensors: {self.compared:,} of {self.to_compare:,} ({read:.1f} MiB read)"

    def run(self, pairs: list[tuple[Entry | None, Entry | None]]) -> list[Outcome]:
        outcomes = [Outcome(a, b) for a, b in pairs]
        first: dict[tuple[int, int], Outcome] = {}
        shared: list[tuple[Outcome, Outcome]] = []
        for outcome in outcomes:
            outcome.status = _status_without_reading(outcome.a, outcome.b)
            if outcome.status == "compare" and self._same_stored_bytes(outcome.a, outcome.b):
                outcome.status = "equal"
            if outcome.status == "compare":
                pair = (id(outcome.a), id(outcome.b))
                if pair in first:
                    shared.append((outcome, first[pair]))
                else:
                    first[pair] = outcome
        self._compare_all(list(first.values()))
        for outcome, same in shared:
            outcome.status, outcome.differing, outcome.partial = same.status, same.differing, same.partial
            outcome.max_abs, outcome.max_rel, outcome.error = same.max_abs, same.max_rel, same.error
        return outcomes

    @staticmethod
    def _same_stored_bytes(a: Tensor | None, b: Tensor | None) -> bool:
        """Both tensors are the same view of the same stored bytes of one file (``diff x.pt x.pt``, a hard
        link): equal, nothing read."""
        assert a is not None and b is not None
        left, right = a.storage, b.storage
        if left is None or right is None or left.source is None or right.source is None:
            return False
        placed = [(s.record, s.offset, s.nbytes, s.dtype, s.byteorder, s.compressed, s.inline_data, s.base)
                  for s in (left, right)]
        views = [(t.stride, t.storage_offset, t.conj, t.neg) for t in (a, b)]
        if placed[0] != placed[1] or left.offset < 0 or left.inline_data is not None or left.base is not None \
                or views[0] != views[1]:
            return False
        identity = _file_identity(left.source)
        return identity is not None and identity == _file_identity(right.source)

    def _compare_all(self, outcomes: list[Outcome]) -> None:
        for outcome in outcomes:
            outcome.status = "equal"
        self.to_compare = len(outcomes)
        window: collections.deque[tuple[Outcome, Future[ChunkResult]]] = collections.deque()
        with ThreadPoolExecutor(self.threads, thread_name_prefix="ckptfs-diff") as pool:
            for outcome, offset, length in self._chunks(outcomes):
                window.append((outcome, pool.submit(self._compare_chunk, outcome, offset, length)))
                if len(window) >= 2 * self.threads:
                    self._collect(*window.popleft())
            while window:
                self._collect(*window.popleft())

    def _chunks(self, outcomes: list[Outcome]) -> Iterator[tuple[Outcome, int, int]]:
        for outcome in outcomes:
            assert outcome.a is not None
            step = CHUNK_ELEMENTS * outcome.a.itemsize
            for offset in range(0, outcome.a.nbytes, step):
                if outcome.error is not None or (self.quick and outcome.status == "differ"):
                    outcome.partial = outcome.error is None
                    break
                yield outcome, offset, min(step, outcome.a.nbytes - offset)

    def _compare_chunk(self, outcome: Outcome, offset: int, length: int) -> ChunkResult | None:
        if outcome.error is not None or (self.quick and outcome.status == "differ"):
            return None
        assert outcome.a is not None and outcome.b is not None
        left = self.a.read(outcome.a, offset, length)
        right = self.b.read(outcome.b, offset, length)
        with self._lock:
            self.bytes_read += len(left) + len(right)
        if left == right:
            return ChunkResult()
        return chunk_difference(outcome.a, left, right)

    def _collect(self, outcome: Outcome, future: Future[ChunkResult | None]) -> None:
        if outcome is not self._last:
            self.compared += 1
            self._last = outcome
        try:
            result = future.result()
        except CkptfsError as exc:
            outcome.status, outcome.error = "error", str(exc)
            return
        if result is None:  # skipped: quick, and an earlier chunk differed
            outcome.partial = outcome.status == "differ"
            return
        if result.differing == 0 or outcome.status == "error":
            return
        outcome.status = "differ"
        outcome.differing += result.differing
        outcome.max_abs = _larger(outcome.max_abs, result.max_abs)
        outcome.max_rel = _larger(outcome.max_rel, result.max_rel)


def _status_without_reading(a: Tensor | None, b: Tensor | None) -> str:
    if b is None:
        return "only_in_a"
    if a is None:
        return "only_in_b"
    if (a.dtype, a.shape, a.has_data) != (b.dtype, b.shape, b.has_data):
        return "changed"
    return "compare" if a.has_data and a.nbytes else "equal"


def _file_identity(source: ByteSource) -> tuple[int, int] | None:
    """The file a source reads, as device and inode numbers (None for sources that are no file)."""
    fd = source.fileno()
    if fd is None:
        return None
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _larger(old: float | None, new: float | None) -> float | None:
    if new is None:
        return old
    return new if old is None or new > old else old


def chunk_difference(tensor: Tensor, left: bytes, right: bytes) -> ChunkResult:
    """How two chunks of a tensor's bytes differ: elements, and (numeric dtypes) the largest absolute difference
    ``|b - a|`` and relative one ``|b - a| / |a|`` (infinite where ``a`` is 0; NaN against NaN is no
    difference, NaN against a number an infinite one)."""
    import numpy as np  # on first need: every command line imports this module, and numpy takes 0.1-0.3 s

    unequal = np.frombuffer(left, np.uint8).reshape(-1, tensor.itemsize) != \
        np.frombuffer(right, np.uint8).reshape(-1, tensor.itemsize)
    differing = int(np.count_nonzero(unequal.any(axis=1)))
    x, y = as_numbers(tensor, left), as_numbers(tensor, right)
    if x is None or y is None:
        return ChunkResult(differing)
    with np.errstate(all="ignore"):
        same = (x == y) | (np.isnan(x) & np.isnan(y))
        gap = np.abs(y - x)
        gap[same] = 0.0
        gap[np.isnan(gap)] = np.inf
        relative = np.where(gap == 0.0, 0.0, gap / np.abs(x))
        return ChunkResult(differing, float(gap.max()), float(relative.max()))


def as_numbers(tensor: Tensor, data: bytes) -> np.ndarray | None:
    """A chunk's elements as float64 (complex128 for complex dtypes), or None when they are no plain numbers
    (quantized, packed, float8 and bit dtypes: compared as bytes only)."""
    import numpy as np

    dtype = tensor.dtype
    if dtype.is_quantized or dtype.packing > 1:
        return None
    if dtype.name == "bfloat16":
        return (np.frombuffer(data, "<u2").astype(np.uint32) << 16).view("<f4").astype(np.float64)
    if dtype.name == "complex32":
        halves = np.frombuffer(data, "<f2").astype(np.float64)
        return halves[0::2] + 1j * halves[1::2]
    if dtype.numpy is None:
        return None
    values = np.frombuffer(data, dtype.numpy)
    return values.astype(np.complex128 if dtype.is_complex else np.float64)
