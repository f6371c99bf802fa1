"""How remote sources are reached and cached: the command line's --endpoint-url, --anonymous, --region,
--storage-option, --cache-size, --max-connections and the disk cache, and the public name of a URL (never its credentials)."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType
from typing import Mapping, NamedTuple

from ckptfs.errors import SourceError
from ckptfs.limits import parse_quantity

MiB = 1 << 20
DEFAULT_CACHE_SIZE = 256 * MiB
"""Room for 16 read-ahead windows of the largest size: streams of a few tensors at once stay cached."""
MIN_CACHE_SIZE = 32 * MiB
"""Two of the largest read-ahead windows: below this a window would evict the one being read."""
DEFAULT_MAX_CONNECTIONS = 16
"""GETs of one object in flight at once (``parts.PartPool``): behind a 40 MB/s per-connection cap, 16 parts
of 8 MiB read ~600 MB/s; on loopback a stream keeps two in flight whatever the bound."""
MAX_CONNECTIONS = 256
DEFAULT_DISK_CACHE_SIZE = 8 << 30
"""The disk cache's bound when --disk-cache-size is not given (its folder is shared by every object cached)."""
DEFAULT_TAIL_SIZE = 2 * MiB
"""The opening suffix GET: a zip's central directory for ~16,000 tensors (~128 bytes a record; a 20,000-tensor
torch.save zip opens in 2 GETs, 3 with 1 MiB). Measured on loopback nginx: +1 MiB costs 1-3 ms; on object
stores (~100 MB/s a stream, 20-50 ms to the first byte) ~10 ms, less than the GET it saves when the
directory is larger than 1 MiB."""
DEFAULT_RETRIES = 6
"""Attempts per request: with full-jitter backoff from 50 ms doubling to 2 s, ~3 s of blips are ridden out."""
DEFAULT_TIMEOUT = 30.0
OWN_OPTIONS = {
    "tail_size": "bytes of the opening suffix GET (default 2MiB)",
    "retries": "attempts per request for transient errors (default 6)",
    "timeout": "seconds to connect and between bytes received (default 30)",
}
"""Storage options every remote source takes; the others go to the backend (S3 credentials, fsspec's options)."""


class DiskCacheSetting(NamedTuple):
    """Remote objects' blocks are cached in ``folder``'s ``blocks/``, at most ``capacity`` bytes of them."""

    folder: Path
    capacity: int


class RemoteOptions(NamedTuple):
    """How URLs are reached (a NamedTuple: every command defines it at start-up, where each millisecond shows)."""

    endpoint_url: str | None = None
    anonymous: bool = False
    region: str | None = None
    storage_options: Mapping[str, str] = MappingProxyType({})
    cache_size: int = DEFAULT_CACHE_SIZE
    disk_cache: DiskCacheSetting | None = None
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    """Connections an object's GETs use at once (``--max-connections``, ``-o max_connections=N``), besides one for
    each thread reading it."""
    pinned: tuple[int, str | None, str | None, int | None] | None = None
    """An object's version an earlier open pinned (size, ETag, version id, Last-Modified in ns: a
    ``RemoteSource.pinned``): the object opens without a request and every read asks for that version, so a
    copy made elsewhere (an unpickled ``ckpt`` file system) reads what the first open read, or fails."""

    def number(self, name: str, default: float) -> float:
        """A numeric storage option of ours (``tail_size`` with a unit if wanted, ``retries``, ``timeout``)."""
        text = self.storage_options.get(name)
        if text is None:
            return default
        try:
            value = float(parse_quantity(text)) if name == "tail_size" else float(text)
        except ValueError:
            raise SourceError(f"storage option {name}={text!r}: expected a number") from None
        if value <= 0 or value != value:
            raise SourceError(f"storage option {name}={text!r}: expected a positive number")
        return value

    def backend_options(self) -> dict[str, str]:
        """The storage options that are not ours."""
        return {k: v for k, v in self.storage_options.items() if k not in OWN_OPTIONS}


def parse_storage_option(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` from the command line."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError("expected KEY=VALUE")
    return key, value


def public_name(url: str) -> str:
    """The URL without what may be a credential: user and password, the query (a presigned URL's signature)
    and the fragment."""
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))
