"""An s3://BUCKET/KEY object as an endpoint: AWS's virtual-hosted URL, or path-style at a given endpoint
(MinIO, Ceph radosgw, moto ...), every request signed with SigV4 unless anonymous."""

from __future__ import annotations

import urllib.parse
from typing import TYPE_CHECKING

from ckptfs.errors import SourceError
from ckptfs.sources.remote.aws_config import S3Settings
from ckptfs.sources.remote.sigv4 import quote, signed_headers

if TYPE_CHECKING:
    from ckptfs.sources.remote.ranged_get import Answer


class S3Endpoint:
    def __init__(self, url: str, settings: S3Settings) -> None:
        self._url, self._settings = url, settings
        parts = urllib.parse.urlsplit(url)
        bucket, key = parts.netloc, urllib.parse.unquote(parts.path.lstrip("/"))
        self.name = f"s3://{bucket}/{key}"
        if not bucket or not key:
            raise SourceError("expected s3://BUCKET/KEY", self.name)
        self.region = settings.region
        self._credentials = settings.credentials
        if settings.endpoint_url:
            base = urllib.parse.urlsplit(settings.endpoint_url)
            if base.scheme not in ("http", "https") or not base.hostname:
                raise SourceError(f"the endpoint URL {base.scheme}://{base.hostname} is not http(s)://HOST", self.name)
            self.scheme = base.scheme
            self.host = base.hostname
            self.port = base.port or (443 if base.scheme == "https" else 80)
            self._bucket_path = base.path.rstrip("/") + "/" + quote(bucket)
            self._path = self._bucket_path + "/" + quote(key, safe="/")
            default_port = self.port == (443 if base.scheme == "https" else 80)
            self._host_header = self.host if default_port else f"{self.host}:{self.port}"
        else:
            self.scheme, self.port = "https", 443
            if "." in bucket:  # a dotted bucket breaks the wildcard certificate of virtual-hosted names
                self.host = f"s3.{self.region}.amazonaws.com"
                self._bucket_path = "/" + quote(bucket)
                self._path = self._bucket_path + "/" + quote(key, safe="/")
            else:
                self.host = f"{bucket}.s3.{self.region}.amazonaws.com"
                self._bucket_path = "/"
                self._path = "/" + quote(key, safe="/")
            self._host_header = self.host

    def _query(self, version_id: str | None) -> dict[str, str]:
        return {"versionId": version_id} if version_id else {}

    def target(self, version_id: str | None) -> str:
        query = self._query(version_id)
        return self._path + ("?" + "&".join(f"{quote(k)}={quote(v)}" for k, v in query.items()) if query else "")

    def bucket_target(self, query: dict[str, str]) -> str:
        """The request target of a request to the object's bucket (a listing) with ``query``."""
        return self._bucket_path + "?" + "&".join(f"{quote(k)}={quote(v)}" for k, v in query.items())

    def headers(self, target: str) -> dict[str, str]:
        if self._credentials is None:
            return {}
        path, _, query = target.partition("?")
        return signed_headers(self._credentials(), self.region, self._host_header, path,
                              dict(urllib.parse.parse_qsl(query)))

    def moved(self, status: int, response: Answer) -> S3Endpoint | None:
        """AWS names the bucket's region when asked in another (301 PermanentRedirect, 400): ask there."""
        region = response.getheader("x-amz-bucket-region")
        if status not in (301, 307, 400) or not region or region == self.region or self._settings.endpoint_url:
            return None
        return S3Endpoint(self._url, self._settings._replace(region=region))
