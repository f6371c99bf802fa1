"""AWS Signature Version 4 for S3 GETs (stdlib only; checked against botocore's signer in the tests)."""

from __future__ import annotations

import hashlib
import hmac
import time
import urllib.parse
from typing import NamedTuple

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


class Credentials(NamedTuple):
    access_key: str
    secret_key: str
    token: str | None = None

    def __repr__(self) -> str:  # never the secret, whatever prints it
        return f"Credentials(access_key={self.access_key[:4]}…)"


def quote(text: str, safe: str = "") -> str:
    """URI encoding as SigV4 wants it: everything but A-Z a-z 0-9 - . _ ~ (and ``safe``)."""
    return urllib.parse.quote(text, safe=safe + "-._~")


def signed_headers(credentials: Credentials, region: str, host: str, path: str, query: dict[str, str],
                   now: float | None = None) -> dict[str, str]:
    """The headers that sign a GET of ``path`` (already URI-encoded) with ``query`` (raw names and values)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    day = stamp[:8]
    headers = {"host": host, "x-amz-content-sha256": EMPTY_SHA256, "x-amz-date": stamp}
    if credentials.token:
        headers["x-amz-security-token"] = credentials.token
    names = sorted(headers)
    canonical_query = "&".join(f"{quote(k)}={quote(v)}" for k, v in sorted(query.items()))
    canonical = "\n".join(["GET", path, canonical_query, "".join(f"{n}:{headers[n].strip()}\n" for n in names),
                           ";".join(names), EMPTY_SHA256])
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + credentials.secret_key).encode()
    for part in (day, region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["Authorization"] = (f"AWS4-HMAC-SHA256 Credential={credentials.access_key}/{scope}, "
                                f"SignedHeaders={';'.join(names)}, Signature={signature}")
    del headers["host"]  # the connection (wire, http.client) sends Host itself, with the same value
    return headers
