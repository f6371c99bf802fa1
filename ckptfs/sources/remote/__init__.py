"""Remote sources: objects behind http(s):// and s3:// URLs read by ranged GETs, other fsspec URLs through fsspec.

``open_remote`` picks the backend by the URL's scheme. See README, "Remote checkpoints".
"""

from __future__ import annotations

from ckptfs.errors import SourceError
from ckptfs.sources.base import ByteSource
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


def open_remote(url: str, options: RemoteOptions = RemoteOptions()) -> ByteSource:
    """The source a URL names, opened (http(s):// and s3:// here, any other scheme through fsspec): its first
    request, the suffix GET, is made."""
    from ckptfs.sources.remote.ranged_get import Endpoint, RangedGetter
    from ckptfs.sources.remote.retry import RetryPolicy
    from ckptfs.sources.remote.source import RemoteSource

    scheme = url.partition("://")[0].lower()
    name = public_name(url)
    retry = RetryPolicy(attempts=int(options.number("retries", DEFAULT_RETRIES)))
    timeout = options.number("timeout", DEFAULT_TIMEOUT)
    tail_size = int(options.number("tail_size", DEFAULT_TAIL_SIZE))
    if scheme in ("http", "https"):
        from ckptfs.sources.remote.http_endpoint import HttpEndpoint

        if options.backend_options():
            raise SourceError(f"storage options {', '.join(sorted(options.backend_options()))} are not ones an "
                              f"{scheme}:// source takes ({', '.join(OWN_OPTIONS)})", name)
        endpoint: Endpoint = HttpEndpoint(url)
    elif scheme == "s3":
        from ckptfs.sources.remote.aws_config import s3_settings
        from ckptfs.sources.remote.s3_endpoint import S3Endpoint

        endpoint = S3Endpoint(url, s3_settings(options, name))
    else:
        from ckptfs.sources.remote.fsspec_source import open_fsspec

        return open_fsspec(url, options)
    return RemoteSource(RangedGetter(endpoint, retry, timeout), options.cache_size, tail_size, options.disk_cache)
