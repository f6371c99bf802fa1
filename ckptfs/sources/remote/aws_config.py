"""S3 settings the way AWS tools find them: options first, then environment variables, then the profile's files
(``AWS_PROFILE``, ``~/.aws/credentials``, ``~/.aws/config``), then botocore's chain when it is installed
(SSO, instance and container roles)."""

from __future__ import annotations

import configparser
import os
from typing import Callable, NamedTuple

from ckptfs.errors import SourceError
from ckptfs.sources.remote.options import RemoteOptions
from ckptfs.sources.remote.sigv4 import Credentials

CredentialSource = Callable[[], Credentials]
S3_OPTIONS = {
    "access_key_id": ("aws_access_key_id", "key"),
    "secret_access_key": ("aws_secret_access_key", "secret"),
    "session_token": ("aws_session_token", "token"),
    "region": ("aws_region",),
    "endpoint_url": ("aws_endpoint_url",),
    "profile": ("aws_profile",),
}
"""Storage options an s3:// source takes (each with its aliases, as boto3 and s3fs name them)."""


class S3Settings(NamedTuple):
    endpoint_url: str | None
    region: str
    credentials: CredentialSource | None
    """None: unsigned requests."""


def s3_settings(options: RemoteOptions, name: str) -> S3Settings:
    given = _storage_options(options, name)
    profile_name = given.get("profile") or os.environ.get("AWS_PROFILE") or os.environ.get("AWS_DEFAULT_PROFILE")
    profile = _profile(profile_name or "default")
    endpoint = (options.endpoint_url or given.get("endpoint_url") or os.environ.get("AWS_ENDPOINT_URL_S3")
                or os.environ.get("AWS_ENDPOINT_URL") or profile.get("endpoint_url"))
    region = (options.region or given.get("region") or os.environ.get("AWS_REGION")
              or os.environ.get("AWS_DEFAULT_REGION") or profile.get("region") or "us-east-1")
    if options.anonymous:
        return S3Settings(endpoint, region, None)
    static = (_credentials(given, "access_key_id", "secret_access_key", "session_token")
              or _credentials(os.environ, "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
              or _credentials(profile, "aws_access_key_id", "aws_secret_access_key", "aws_session_token"))
    if static is not None:
        return S3Settings(endpoint, region, lambda: static)
    return S3Settings(endpoint, region, _botocore_chain(profile_name, name))


def _storage_options(options: RemoteOptions, name: str) -> dict[str, str]:
    aliases = {alias: key for key, names in S3_OPTIONS.items() for alias in (key, *names)}
    given = {}
    for key, value in options.backend_options().items():
        if key not in aliases:
            raise SourceError(f"storage option {key!r} is not one an s3:// source takes "
                              f"({', '.join(sorted(S3_OPTIONS))}, tail_size, retries, timeout)", name)
        given[aliases[key]] = value
    return given


def _credentials(values: object, key: str, secret: str, token: str) -> Credentials | None:
    get = values.get  # type: ignore[attr-defined]
    if get(key) and get(secret):
        return Credentials(get(key), get(secret), get(token) or None)
    return None


def _profile(name: str) -> dict[str, str]:
    """The profile's settings: its section of the config file, overridden by the credentials file's."""
    settings: dict[str, str] = {}
    config = os.environ.get("AWS_CONFIG_FILE") or os.path.expanduser("~/.aws/config")
    shared = os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or os.path.expanduser("~/.aws/credentials")
    for path, section in ((config, name if name == "default" else f"profile {name}"), (shared, name)):
        parser = configparser.RawConfigParser()
        try:
            parser.read(path)
        except (configparser.Error, UnicodeDecodeError, OSError):
            continue
        if parser.has_section(section):
            settings.update(parser.items(section))
    return settings


def _botocore_chain(profile: str | None, name: str) -> CredentialSource:
    try:
        import botocore.session
    except ImportError:
        raise SourceError("no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or "
                          "~/.aws/credentials (or install botocore for SSO and instance roles); "
                          "--anonymous for a public bucket", name) from None
    found = botocore.session.Session(profile=profile).get_credentials()
    if found is None:
        raise SourceError("no AWS credentials found by botocore's chain; --anonymous for a public bucket", name)

    def current() -> Credentials:
        frozen = found.get_frozen_credentials()  # refreshed by botocore when they expire
        return Credentials(frozen.access_key, frozen.secret_key, frozen.token)

    return current
