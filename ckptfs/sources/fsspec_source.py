"""``FsspecSource``: a file of an fsspec file system (gs://, az://, hf://, memory:// ..., or a file system object
fsspec hands the ``ckpt`` file system), read with ranged ``cat_file`` calls.

Every read is one ``cat_file`` whose length is checked; the version is not pinned and nothing is cached here
(fsspec's backends have their own caching and retries): the direct sources (``sources.remote``) are the fast,
checked path for s3:// and http(s)://. fsspec is imported only when such a source is made.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from ckptfs.errors import NoSuchObjectError, SourceError, UnsupportedError
from ckptfs.sources.base import SourceStat


class FsspecSource:
    """``path`` of the fsspec file system ``fs``; ``name`` is what errors and ``index.json`` show (never a
    credential: the URL without its options). ``remake`` re-creates the file system in a forked process."""

    def __init__(self, fs: Any, path: str, name: str | None = None,
                 remake: Callable[[], Any] | None = None) -> None:
        self._fs = fs
        self._path = path
        self._remake = remake
        self.name = name or fs.unstrip_protocol(path)
        info = _info(fs, path, self.name)
        if info.get("type") == "directory":  # no object: the URL may name a prefix (``sources.remote``)
            raise NoSuchObjectError("a directory, not a checkpoint file", self.name)
        self.size = int(info.get("size") or 0)
        self._mtime_ns = _mtime_ns(info)
        self.identity = _identity(self.name, self.size, self._mtime_ns, info)
        """What names the object's version as its file system described it at open, or None where that names
        none (no generation, version id, strong ETag nor content hash): the metadata cache's key for it."""

    @classmethod
    def from_url(cls, url: str, storage_options: Mapping[str, Any], name: str) -> FsspecSource:
        """The file an fsspec URL names, its file system made with ``storage_options`` (and remade after a fork)."""
        def remake() -> Any:
            return url_to_fs(url, storage_options, name)[0]

        fs, path = url_to_fs(url, storage_options, name)
        return cls(fs, path, name, remake)

    def read(self, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise SourceError(f"read of {length} bytes at offset {offset} is outside the object "
                              f"({self.size} bytes)", self.name)
        if length == 0:
            return b""
        try:
            data = self._fs.cat_file(self._path, start=offset, end=offset + length)
        except Exception as exc:  # fsspec backends raise what their libraries raise
            raise SourceError(f"read of {length} bytes at offset {offset} failed: {_describe(exc)}",
                              self.name) from None
        if len(data) != length:
            raise SourceError(f"read of {length} bytes at offset {offset} returned {len(data)}", self.name)
        return bytes(data)

    def fileno(self) -> int | None:
        return None

    def stat(self) -> SourceStat:
        return SourceStat.read_only(self.size, self._mtime_ns)

    def reopen(self) -> None:
        """In a forked process: a file system made here is made again (its sessions are the parent's); one the
        caller gave is the caller's (fsspec resets its async loop after a fork itself)."""
        if self._remake is not None:
            self._fs = self._remake()

    def close(self) -> None:
        """Nothing to do: every read is its own request, and the file system may be shared."""


def url_to_fs(url: str, storage_options: Mapping[str, Any], name: str) -> tuple[Any, str]:
    """fsspec's file system and path for ``url`` (a new instance: never one a forked parent made)."""
    try:
        import fsspec
    except ImportError:
        raise UnsupportedError(f"{url.partition('://')[0]}:// needs fsspec (pip install fsspec and the backend for "
                               "the scheme)", name) from None
    try:
        fs, path = fsspec.core.url_to_fs(url, skip_instance_cache=True, **storage_options)
    except (ImportError, ValueError, TypeError) as exc:
        raise UnsupportedError(f"fsspec cannot open it: {exc}", name) from None
    return fs, path


def _info(fs: Any, path: str, name: str) -> dict[str, Any]:
    try:
        return fs.info(path)  # type: ignore[no-any-return]
    except FileNotFoundError:
        raise NoSuchObjectError("no such object", name) from None
    except Exception as exc:  # fsspec backends raise what their libraries raise
        raise SourceError(f"cannot open: {_describe(exc)}", name) from None


VERSION_FIELDS = ("generation", "VersionId", "version_id", "ETag", "etag", "md5Hash", "crc32c", "blob_id")
"""Fields of fsspec backends' ``info`` that change with the object's content (gcsfs, s3fs, adlfs, hf ...)."""


def _identity(name: str, size: int, mtime_ns: int, info: dict[str, Any]) -> str | None:
    fields = {key: str(info[key]) for key in VERSION_FIELDS if isinstance(info.get(key), (str, int))
              and str(info[key]) and not str(info[key]).startswith("W/")}
    lfs = info.get("lfs")
    if isinstance(lfs, dict) and isinstance(lfs.get("sha256"), str):
        fields["lfs.sha256"] = lfs["sha256"]
    if not fields:
        return None
    return "\n".join([name, str(size), str(mtime_ns), *(f"{key}={value}" for key, value in sorted(fields.items()))])


def _describe(exc: Exception) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _mtime_ns(info: dict[str, Any]) -> int:
    from datetime import datetime  # here: a local file's start never makes this source

    for key in ("LastModified", "mtime", "updated", "last_modified", "created", "creation_time"):
        value = info.get(key)
        if isinstance(value, datetime):
            return int(value.timestamp()) * 10**9
        if isinstance(value, (int, float)):
            return int(value) * 10**9
        if isinstance(value, str):
            try:
                return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()) * 10**9
            except ValueError:
                continue
    return 0
