"""Bytes already in memory as a source: checkpoints embedded in other data, generated inputs."""

from __future__ import annotations

from ckptfs.errors import SourceError
from ckptfs.sources.base import SourceStat


class BytesSource:
    def __init__(self, data: bytes, name: str = "<bytes>") -> None:
        self._data = bytes(data)
        self.name = name
        self.size = len(self._data)

    def read(self, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise SourceError(
                f"read of {length} bytes at offset {offset} is outside the data "
                f"({self.size} bytes)",
                self.name,
            )
        return self._data[offset : offset + length]

    def fileno(self) -> int | None:
        return None

    def stat(self) -> SourceStat | None:
        return None

    def reopen(self) -> None:
        pass

    def close(self) -> None:
        pass
