"""Remote sources: objects behind http(s):// and s3:// URLs read by ranged GETs, other fsspec URLs through fsspec;
a URL prefix (a DCP directory on object storage) as a set of them.

``open_remote`` picks the backend by the URL's scheme. A URL ending in ``/`` names a prefix; one that does not
names an object, and when there is none (404, or 403) but the URL is a prefix that holds a ``.metadata`` (or, where the
store lists, any object), the prefix. See docs/remote.md.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from ckptfs.errors import NoSuchObjectError, SourceError
from ckptfs.sources.base import ByteSource
from ckptfs.sources.prefix import Lister, PrefixSet
from ckptfs.sources.remote.options import (
    DEFAULT_RETRIES,
    DEFAULT_TAIL_SIZE,
    DEFAULT_TIMEOUT,
    OWN_OPTIONS,
    DiskCacheSetting,
    RemoteOptions,
    public_name,
)

__all__ = ["DiskCacheSetting", "RemoteOptions", "open_remote", "public_name"]
MEMBER_TAIL_SIZE = 64 * 1024
"""The opening suffix GET of a DCP data file below a prefix: one cache block."""
DIRECT_SCHEMES = ("http", "https", "s3")
"""Read by ckptfs's own ranged GETs; every other scheme goes through fsspec."""
HTTP_CANNOT_LIST = ("an http(s):// server has no listing, and without a .metadata (a directory saved with "
                    "use_collectives=False) the per-rank __N.metadata files must be listed: read it from s3:// "
                    "or a local copy")


def open_remote(url: str, options: RemoteOptions = RemoteOptions()) -> ByteSource:
    """The object or prefix a URL names, opened (an object's first request, its suffix GET, is made)."""
    if _path_of(url).endswith("/"):
        return open_prefix(url, options._replace(pinned=None))
    if options.pinned is not None:
        return _open_object(url, options)
    try:
        return _open_object(url, options)
    except NoSuchObjectError:
        prefix = open_prefix(_with_slash(url), options._replace(pinned=None))
        try:
            found = prefix.exists()
        except SourceError:
            found = False
        if not found:
            prefix.close()
            raise
        return prefix


def open_prefix(url: str, options: RemoteOptions = RemoteOptions()) -> PrefixSet:
    """The objects below ``url`` (ending in ``/``), each opened on first use; nothing is requested here."""
    scheme = _scheme(url)
    name = public_name(url)
    lister: Lister | None = None
    if scheme in DIRECT_SCHEMES:
        data_options = _member_options(options)

        def open_member(member: str) -> ByteSource:
            return _open_object(_member_url(url, member), options if member.endswith(".metadata") else data_options)

        if scheme == "s3":
            lister = _s3_lister(url, options, name)
    else:
        def open_member(member: str) -> ByteSource:
            return _open_object(url + member, options)

        lister = _fsspec_lister(url, options, name)
    return PrefixSet(name, open_member, lister, HTTP_CANNOT_LIST if lister is None else "")


def _member_options(options: RemoteOptions) -> RemoteOptions:
    """A data file's options: a ``.distcp`` is read at its items' offsets, not from its end, so its opening GET
    asks for ``MEMBER_TAIL_SIZE`` bytes (the metadata's, usually the whole file, keeps ``tail_size``)."""
    tail = min(int(options.number("tail_size", DEFAULT_TAIL_SIZE)), MEMBER_TAIL_SIZE)
    return options._replace(storage_options={**options.storage_options, "tail_size": str(tail)})


def _open_object(url: str, options: RemoteOptions) -> ByteSource:
    from ckptfs.sources.remote.ranged_get import Endpoint, ObjectVersion, RangedGetter
    from ckptfs.sources.remote.retry import RetryPolicy
    from ckptfs.sources.remote.source import RemoteSource

    scheme = _scheme(url)
    name = public_name(url)
    if scheme not in DIRECT_SCHEMES:
        from ckptfs.sources.fsspec_source import FsspecSource

        return FsspecSource.from_url(url, options.backend_options(), name)
    retry = RetryPolicy(attempts=int(options.number("retries", DEFAULT_RETRIES)))
    timeout = options.number("timeout", DEFAULT_TIMEOUT)
    tail_size = int(options.number("tail_size", DEFAULT_TAIL_SIZE))
    if scheme in ("http", "https"):
        from ckptfs.sources.remote.http_endpoint import HttpEndpoint

        if options.backend_options():
            raise SourceError(f"storage options {', '.join(sorted(options.backend_options()))} are not ones an "
                              f"{scheme}:// source takes ({', '.join(OWN_OPTIONS)})", name)
        endpoint: Endpoint = HttpEndpoint(url)
    else:
        from ckptfs.sources.remote.aws_config import s3_settings
        from ckptfs.sources.remote.s3_endpoint import S3Endpoint

        endpoint = S3Endpoint(url, s3_settings(options, name))
    pinned = None if options.pinned is None else ObjectVersion(*options.pinned)
    return RemoteSource(RangedGetter(endpoint, retry, timeout), options.cache_size, tail_size, options.disk_cache,
                        pinned, options.max_connections)


def _s3_lister(url: str, options: RemoteOptions, name: str) -> Lister:
    def listing() -> dict[str, int]:
        from ckptfs.sources.remote.aws_config import s3_settings
        from ckptfs.sources.remote.retry import RetryPolicy
        from ckptfs.sources.remote.s3_endpoint import S3Endpoint
        from ckptfs.sources.remote.s3_list import list_prefix

        endpoint = S3Endpoint(_member_url(url, ".metadata"), s3_settings(options, name))
        prefix = urllib.parse.unquote(urllib.parse.urlsplit(url).path.lstrip("/"))
        retry = RetryPolicy(attempts=int(options.number("retries", DEFAULT_RETRIES)))
        return list_prefix(endpoint, prefix, retry, options.number("timeout", DEFAULT_TIMEOUT), name)

    return listing


def _fsspec_lister(url: str, options: RemoteOptions, name: str) -> Lister:
    def listing() -> dict[str, int]:
        from ckptfs.sources.fsspec_source import url_to_fs

        fs, path = url_to_fs(url, options.backend_options(), name)
        try:
            entries: list[dict[str, Any]] = fs.ls(path, detail=True)
        except FileNotFoundError:
            raise NoSuchObjectError("no such directory", name) from None
        except Exception as exc:  # fsspec backends raise what their libraries raise
            raise SourceError(f"cannot list: {type(exc).__name__}: {exc}", name) from None
        return {entry["name"].rstrip("/").rpartition("/")[2]: int(entry.get("size") or 0)
                for entry in entries if entry.get("type") == "file"}

    return listing


def _scheme(url: str) -> str:
    return url.partition("://")[0].lower()


def _path_of(url: str) -> str:
    return urllib.parse.urlsplit(url).path if _scheme(url) in DIRECT_SCHEMES else url


def _with_slash(url: str) -> str:
    if _scheme(url) not in DIRECT_SCHEMES:
        return url + "/"
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(path=parts.path + "/", fragment=""))


def _member_url(url: str, member: str) -> str:
    """``member``'s URL below the prefix ``url`` (its name percent-encoded: S3 keys and URL paths decode it)."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(path=parts.path + urllib.parse.quote(member, safe=""),
                                                  fragment=""))
