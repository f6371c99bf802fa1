"""The objects directly below an S3 prefix, by signed ListObjectsV2 requests (with ``delimiter=/``, page after
page): what a DCP directory saved without collectives needs to find its per-rank ``__N.metadata`` files."""

from __future__ import annotations

import http.client
import ssl
from xml.etree import ElementTree

from ckptfs.errors import LimitExceededError, NoSuchObjectError, SourceError
from ckptfs.sources.remote.ranged_get import TRANSIENT_STATUS, status_phrase
from ckptfs.sources.remote.retry import MissingError, PermanentError, RetryPolicy, TransientError
from ckptfs.sources.remote.s3_endpoint import S3Endpoint

MAX_PAGE_BYTES = 16 << 20
"""A page of at most 1,000 keys is ~300 KiB of XML; a larger answer is refused, not read without bound."""
MAX_OBJECTS = 1_000_000
PAGE_KEYS = 1000
"""Keys asked a page (S3's maximum)."""


def list_prefix(endpoint: S3Endpoint, prefix: str, retry: RetryPolicy, timeout: float, name: str) -> dict[str, int]:
    """Name (below ``prefix``) and size of every object directly below ``prefix`` in ``endpoint``'s bucket."""
    found: dict[str, int] = {}
    token: str | None = None
    while True:
        query = {"list-type": "2", "delimiter": "/", "max-keys": str(PAGE_KEYS), **({"prefix": prefix} if prefix else {}),
                 **({"continuation-token": token} if token else {})}
        target = endpoint.bucket_target(query)
        page: list[bytes] = []
        try:
            retry.run(lambda: page.append(_get(endpoint, target, timeout)), name)  # noqa: B023  (called here)
        except NoSuchObjectError as exc:
            raise NoSuchObjectError(f"cannot list the prefix: {exc.reason}", name) from None
        except SourceError as exc:
            raise SourceError(f"cannot list the prefix: {exc.reason}", name) from None
        token = _parse_page(page[0], prefix, found, name)
        if len(found) > MAX_OBJECTS:
            raise LimitExceededError(f"more than {MAX_OBJECTS} objects below the prefix", name)
        if token is None:
            return found


def _get(endpoint: S3Endpoint, target: str, timeout: float) -> bytes:
    if endpoint.scheme == "https":
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            endpoint.host, endpoint.port, timeout=timeout, context=ssl.create_default_context())
    else:
        conn = http.client.HTTPConnection(endpoint.host, endpoint.port, timeout=timeout)
    try:
        conn.request("GET", target, headers={"Accept-Encoding": "identity", **endpoint.headers(target)})
        response = conn.getresponse()
        body = response.read(MAX_PAGE_BYTES + 1)
    except ssl.SSLCertVerificationError as exc:
        raise PermanentError(f"TLS: {exc.verify_message or exc}") from None
    except (OSError, http.client.HTTPException) as exc:
        raise TransientError(getattr(exc, "strerror", None) or type(exc).__name__) from None
    finally:
        conn.close()
    if response.status != 200:
        code = _text(body, "Code")
        what = f"HTTP {response.status} {status_phrase(response.status, response.reason)}" + (f" ({code})" if code else "")
        if response.status in TRANSIENT_STATUS:
            raise TransientError(what)
        raise MissingError(what) if response.status == 404 else PermanentError(what)  # 403: not allowed to list
    if len(body) > MAX_PAGE_BYTES:
        raise PermanentError(f"a listing page of more than {MAX_PAGE_BYTES} bytes")
    return body


def _parse_page(body: bytes, prefix: str, found: dict[str, int], name: str) -> str | None:
    """Adds the page's objects to ``found``; the continuation token of the next page, or None."""
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError as exc:
        raise SourceError(f"cannot list the prefix: the listing is not XML ({exc})", name) from None
    for element in root:
        if _local(element.tag) != "Contents":
            continue
        fields = {_local(child.tag): child.text or "" for child in element}
        key, size = fields.get("Key", ""), fields.get("Size", "")
        if not key.startswith(prefix) or not size.isdigit():
            raise SourceError(f"cannot list the prefix: the listing names {key!r} of size {size!r}", name)
        if key != prefix:
            found[key[len(prefix):]] = int(size)
    truncated = {_local(e.tag): e.text for e in root if _local(e.tag) in ("IsTruncated", "NextContinuationToken")}
    if truncated.get("IsTruncated") == "true":
        if not truncated.get("NextContinuationToken"):
            raise SourceError("cannot list the prefix: a truncated listing without a continuation token", name)
        return truncated["NextContinuationToken"]
    return None


def _local(tag: str) -> str:
    return tag.rpartition("}")[2]


def _text(body: bytes, tag: str) -> str | None:
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError:
        return None
    for element in root.iter():
        if _local(element.tag) == tag:
            return element.text
    return None
