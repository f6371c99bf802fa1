"""The source a ``ckpt`` file system reads: what fsspec hands it as ``fo`` (a path or URL with the chained target's
protocol and options, an open file, a ckptfs ``ByteSource``).

A target ckptfs reads itself (s3://, http(s)://) goes through ``sources.open_source``: checked ranged GETs, the
object's version pinned, retries, the read-ahead cache. Its fsspec storage options are translated to ckptfs's
(s3fs's ``anon``, ``key``, ``secret``, ``token``, ``endpoint_url``, ``client_kwargs`` ``endpoint_url`` and
``region_name``, ``profile``; ckptfs's own ``max_connections``, as ``--max-connections``); a target given an option
ckptfs has no equivalent for is read through its fsspec backend instead, which honours it.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import fsspec
from fsspec.implementations.local import LocalFileSystem

from ckptfs.errors import SourceError
from ckptfs.sources import ByteSource, FileObjectSource, FsspecSource, RemoteOptions, open_source
from ckptfs.sources.remote.options import DEFAULT_MAX_CONNECTIONS, MAX_CONNECTIONS, OWN_OPTIONS, public_name

S3_PROTOCOLS = ("s3", "s3a")
HTTP_PROTOCOLS = ("http", "https")
S3FS_OPTIONS = {"key": "access_key_id", "secret": "secret_access_key", "token": "session_token",
                "profile": "profile"}
"""s3fs's names of the options an s3:// source of ckptfs takes."""


def target_source(fo: Any, protocol: str | None, options: Mapping[str, Any] | None,
                  pinned: tuple[int, str | None, str | None, int | None] | None = None) -> ByteSource:
    """What ``fo`` names: a ckptfs ``ByteSource`` as it is, an open binary file, a local file (read with
    ``pread``), an s3:// or http(s):// object read by ckptfs (at the version ``pinned`` when given:
    ``RemoteOptions.pinned``), or a file of another fsspec file system."""
    if hasattr(fo, "read") and hasattr(fo, "size") and hasattr(fo, "reopen"):
        return fo  # type: ignore[no-any-return]
    if hasattr(fo, "read") and hasattr(fo, "seek"):
        return FileObjectSource(fo)
    url = os.fspath(fo)
    given = dict(options or {})
    scheme = ((protocol or url.partition("://")[0]) if "://" in url or protocol else "").lower()
    if scheme in S3_PROTOCOLS + HTTP_PROTOCOLS:
        full = url if "://" in url else f"{'s3' if scheme in S3_PROTOCOLS else scheme}://{url}"
        remote = remote_options(scheme, given)
        if remote is not None:
            return open_source(full.replace("s3a://", "s3://", 1), remote._replace(pinned=pinned))
    fs, path = fsspec.core.url_to_fs(url, **({"protocol": protocol} if protocol else {}), **given)
    if isinstance(fs, LocalFileSystem):
        return open_source(path)
    return FsspecSource(fs, path, public_name(fs.unstrip_protocol(path)))


def remote_options(scheme: str, options: Mapping[str, Any]) -> RemoteOptions | None:
    """ckptfs's options for fsspec's storage ``options`` of an s3:// or http(s):// target; None if one of them
    has no equivalent here (the target is then read through fsspec)."""
    endpoint_url: str | None = None
    region: str | None = None
    anonymous = False
    connections = DEFAULT_MAX_CONNECTIONS
    storage: dict[str, str] = {}
    for key, value in options.items():
        if key in OWN_OPTIONS:
            storage[key] = str(value)
        elif key == "max_connections":
            connections = max_connections(value)
        elif scheme in HTTP_PROTOCOLS:
            return None
        elif key == "anon":
            anonymous = bool(value)
        elif key == "endpoint_url" and value:
            endpoint_url = str(value)
        elif key in S3FS_OPTIONS:
            if value is not None:
                storage[S3FS_OPTIONS[key]] = str(value)
        elif key == "client_kwargs" and isinstance(value, Mapping) and set(value) <= {"endpoint_url", "region_name"}:
            endpoint_url = value.get("endpoint_url") or endpoint_url
            region = value.get("region_name") or region
        else:
            return None
    return RemoteOptions(endpoint_url=endpoint_url, anonymous=anonymous, region=region, storage_options=storage,
                         max_connections=connections)


def max_connections(value: Any) -> int:
    """The ``max_connections`` storage option: an int, or its digits (as ``--max-connections`` takes it)."""
    text = str(value)
    if isinstance(value, bool) or not text.isdigit() or not 1 <= int(text) <= MAX_CONNECTIONS:
        raise SourceError(f"storage option max_connections={value!r}: expected a whole number from 1 to "
                          f"{MAX_CONNECTIONS}")
    return int(text)
