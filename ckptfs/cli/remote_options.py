"""The options of commands that open a checkpoint by URL: --endpoint-url, --anonymous, --region,
--storage-option, --cache-size, --max-connections, --disk-cache-size (with the cache options' --cache-dir and --no-cache)."""

from __future__ import annotations

import argparse

from ckptfs.cli.cache_options import cache_dir
from ckptfs.limits import parse_quantity
from ckptfs.sources import RemoteOptions
from ckptfs.sources.remote.options import (
    DEFAULT_CACHE_SIZE,
    DEFAULT_DISK_CACHE_SIZE,
    DEFAULT_MAX_CONNECTIONS,
    MAX_CONNECTIONS,
    MIN_CACHE_SIZE,
    DiskCacheSetting,
    parse_storage_option,
)


def add_remote_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("remote checkpoints (s3://, http(s)://, other fsspec URLs)")
    group.add_argument("--endpoint-url", metavar="URL",
                       help="S3 endpoint (MinIO, Ceph, ...): path-style requests to it (default: AWS_ENDPOINT_URL_S3, "
                            "AWS_ENDPOINT_URL, the profile's endpoint_url, else AWS)")
    group.add_argument("--anonymous", action="store_true", help="unsigned requests (a public bucket)")
    group.add_argument("--region", metavar="REGION",
                       help="S3 region (default: AWS_REGION, AWS_DEFAULT_REGION, the profile's, else us-east-1)")
    group.add_argument("--storage-option", dest="storage_options", action="append", default=[],
                       type=_storage_option, metavar="KEY=VALUE",
                       help="passed to the backend (repeatable): s3:// takes profile, region, endpoint_url and "
                            "keys (better from the environment: the command line is visible in ps); every URL "
                            "takes tail_size, retries, timeout; fsspec URLs take their backend's options")
    group.add_argument("--cache-size", type=_cache_size, default=DEFAULT_CACHE_SIZE, metavar="SIZE",
                       help="memory for fetched ranges (default 256MiB, at least 32MiB)")
    group.add_argument("--max-connections", type=_max_connections, default=DEFAULT_MAX_CONNECTIONS, metavar="N",
                       help="GETs of one object in flight at once: a sequential read keeps as many parts of 8MiB "
                            "in flight as one connection's measured rate needs, up to N (default 16)")
    group.add_argument("--disk-cache-size", type=_disk_cache_size, metavar="SIZE",
                       help="cache remote blocks on disk, in the cache folder's blocks/, up to SIZE for all objects "
                            "(default 8GiB); remote blocks are cached on disk only when this or --cache-dir is given")


def remote_options(args: argparse.Namespace) -> RemoteOptions:
    return RemoteOptions(endpoint_url=args.endpoint_url, anonymous=args.anonymous, region=args.region,
                         storage_options=dict(args.storage_options), cache_size=args.cache_size,
                         max_connections=args.max_connections, disk_cache=_disk_cache(args))


def _disk_cache(args: argparse.Namespace) -> DiskCacheSetting | None:
    """Where remote blocks are cached on disk: only when asked (--cache-dir or --disk-cache-size), since a
    mount reading a large checkpoint would otherwise fill the home folder unawares."""
    folder = cache_dir(args)
    if folder is None or (args.cache_dir is None and args.disk_cache_size is None):
        return None
    return DiskCacheSetting(folder, args.disk_cache_size or DEFAULT_DISK_CACHE_SIZE)


def _storage_option(text: str) -> tuple[str, str]:
    try:
        return parse_storage_option(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _disk_cache_size(text: str) -> int:
    try:
        size = parse_quantity(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if size < 1 << 20:
        raise argparse.ArgumentTypeError("at least 1MiB")
    return size


def _max_connections(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= MAX_CONNECTIONS:
        raise argparse.ArgumentTypeError(f"expected a whole number from 1 to {MAX_CONNECTIONS}")
    return int(text)


def _cache_size(text: str) -> int:
    try:
        size = parse_quantity(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if size < MIN_CACHE_SIZE:
        raise argparse.ArgumentTypeError("at least 32MiB")
    return size
