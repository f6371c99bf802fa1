"""A directory's files held in memory, as a ``SourceSet``: the fuzzer's directory inputs."""

from __future__ import annotations

from ckptfs.errors import NoSuchObjectError, SourceError
from ckptfs.sources import ByteSource, BytesSource


class BytesDirectory:
    """A directory's files held in memory, as a ``SourceSet`` (what ``DirectorySource`` is for a directory on disk)."""

    def __init__(self, files: dict[str, bytes], name: str = "fuzz.dcp") -> None:
        self.name = name
        self._files = {member: BytesSource(data, f"{name}/{member}") for member, data in sorted(files.items())}
        self._sizes = {member: source.size for member, source in self._files.items()}
        self.size = sum(self._sizes.values())

    probe_all = True

    def names(self) -> dict[str, int]:
        return self._sizes

    def member_size(self, member: str) -> int:
        size = self._sizes.get(member)
        if size is None:
            raise NoSuchObjectError(f"no file {member!r} in the directory", self.name)
        return size

    def open(self, member: str) -> ByteSource:
        source = self._files.get(member)
        if source is None:
            raise SourceError(f"no file {member!r} in the directory", self.name)
        return source

    def head(self, member: str, length: int) -> bytes:
        source = self._files.get(member)
        return b"" if source is None else source.read(0, min(length, source.size))

    def read(self, offset: int, length: int) -> bytes:
        raise SourceError("a directory has no bytes of its own: read its files", self.name)

    def fileno(self) -> None:
        return None

    def stat(self) -> None:
        return None

    def reopen(self) -> None:
        pass

    def close(self) -> None:
        pass
