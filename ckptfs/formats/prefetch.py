"""The bytes a parser reads while opening, kept so that no range is read twice.

Opening a checkpoint must cost a few large reads whatever its data size (a
remote source turns each read into a request): the tail first (a zip's end
records and central directory, and a remote's suffix request holds it
already), then the spans the format needs. A read that overlaps what is kept
fetches only the missing part.
"""

from __future__ import annotations

from ckptfs.sources import ByteSource, tail_hint

TAIL_BYTES = 64 * 1024
"""Smallest tail read first; a source's ``tail_hint`` raises it."""


class Prefetch:
    def __init__(self, source: ByteSource) -> None:
        self.source = source
        self.size = source.size
        self._spans: list[tuple[int, bytes]] = []
        """Disjoint (offset, bytes) spans already read, in no particular order."""
        tail_length = min(self.size, max(TAIL_BYTES, tail_hint(source)))
        self.tail_start = self.size - tail_length
        self.tail = self.read(self.tail_start, tail_length)

    def read(self, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset``, reading only what no kept span holds (at most one read)."""
        end = offset + length
        for start, data in self._spans:
            if start <= offset and end <= start + len(data):
                return data[offset - start : end - start]
        if length == 0:
            return b""
        before = self._span_containing(offset)
        after = self._span_containing(end - 1)
        read_from = before[0] + len(before[1]) if before is not None else offset
        read_to = after[0] if after is not None else end
        fresh = self.source.read(read_from, read_to - read_from)
        merged_start = before[0] if before is not None else read_from
        merged = (before[1] if before is not None else b"") + fresh + (after[1] if after is not None else b"")
        self._spans = [s for s in self._spans if s is not before and s is not after and
                       not (merged_start <= s[0] and s[0] + len(s[1]) <= merged_start + len(merged))]
        self._spans.append((merged_start, merged))
        return merged[offset - merged_start : end - merged_start]

    def known_start_after(self, offset: int, gap: int) -> int | None:
        """The start of a kept span beginning at most ``gap`` bytes after ``offset``: a read ending at
        ``offset`` may as well run up to it."""
        starts = [start for start, _ in self._spans if offset <= start <= offset + gap]
        return min(starts) if starts else None

    def covers(self, offset: int, length: int) -> bool:
        return length == 0 or any(start <= offset and offset + length <= start + len(data)
                                  for start, data in self._spans)

    def head(self, length: int) -> bytes:
        """The first ``length`` bytes (fewer in a shorter file)."""
        return self.read(0, min(self.size, length))

    def _span_containing(self, offset: int) -> tuple[int, bytes] | None:
        for span in self._spans:
            if span[0] <= offset < span[0] + len(span[1]):
                return span
        return None
