"""Ranged GETs of one object over HTTP(S): every answer checked, transient failures retried.

The first request is a suffix GET (``Range: bytes=-N``): its ``Content-Range`` gives the object's size, so no
HEAD is needed, and its ETag (and S3 version id) pins the version every later GET asks for (``If-Match``,
``versionId``). An answer is accepted only as a 206 whose ``Content-Range`` is exactly the range asked and
whose body is whole; a 200 (a server ignoring ranges) is refused before its body is read.

Our own lean HTTP/1.1 connection (``wire``) rather than obstore or fsspec: obstore's Tokio runtime hangs in a
process forked after it ran (the mount daemon forks after parsing), fsspec/aiohttp and urllib3 were 2-3x slower
per small GET, and ``http.client`` spent a sixth of a 4 KiB read's latency writing the request and parsing the
answer's headers (docs/remote.md).
"""

from __future__ import annotations

import email.utils
import http
import http.client
import re
import socket
import ssl
import threading
from typing import NamedTuple, Protocol

from ckptfs.errors import ObjectChangedError
from ckptfs.sources.remote.retry import MissingError, PermanentError, RetryPolicy, TransientError
from ckptfs.sources.remote.wire import WireConnection, WireResponse

_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")
_ERROR_CODE = re.compile(rb"<Code>([A-Za-z0-9.]{1,64})</Code>")
TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
MISSING_STATUS = frozenset({403, 404})
"""No object to read there: S3 answers 403 for a missing key to whoever may not list the bucket, a web server
for a directory (which a URL without its trailing slash may name)."""
MAX_REDIRECTS = 5
ERROR_BODY_BYTES = 4096
"""An error answer is read this far, for the S3 error code it names."""


class ObjectVersion(NamedTuple):
    size: int
    etag: str | None
    version_id: str | None
    mtime_ns: int | None


class Answer(Protocol):
    """What an endpoint reads of an answer (a ``wire.WireResponse``, an ``http.client.HTTPResponse``)."""

    status: int

    def getheader(self, name: str, default: str | None = None) -> str | None:
        ...


class Endpoint(Protocol):
    """Where an object is and how a request for it is made (plain HTTP, or signed S3)."""

    name: str
    """The public URL: never a credential in it."""
    scheme: str
    host: str
    port: int

    def target(self, version_id: str | None) -> str:
        """The request target (path and query) for the object, at ``version_id`` when given."""
        ...

    def headers(self, target: str) -> dict[str, str]:
        """Headers a GET of ``target`` needs besides Range and If-Match (S3: its signature)."""
        ...

    def moved(self, status: int, response: Answer) -> Endpoint | None:
        """Where a redirecting answer sends the request (an HTTP Location; S3's bucket region), or None."""
        ...


class RangedGetter:
    """Ranged GETs of one object, one keep-alive connection per thread."""

    def __init__(self, endpoint: Endpoint, retry: RetryPolicy, timeout: float) -> None:
        self.endpoint = endpoint
        self.retry = retry
        self.timeout = timeout
        self.version: ObjectVersion | None = None
        self._local = threading.local()

    def get_tail(self, count: int) -> bytes:
        """The object's last ``count`` bytes (all of it when smaller); pins its size and version."""
        result: list[bytes] = []
        self.retry.run(lambda: result.append(self._attempt(f"bytes=-{count}", None, count)), self.endpoint.name)
        return result[0]

    def get_into(self, start: int, view: memoryview) -> None:
        """Fills ``view`` with the object's bytes from ``start``, of the version pinned by ``get_tail``."""
        self.retry.run(lambda: self._attempt(f"bytes={start}-{start + len(view) - 1}", view, start),
                       self.endpoint.name)

    def reset(self) -> None:
        """Forgets this process's connections (after a fork they are the parent's)."""
        self._local = threading.local()

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
        self.reset()

    def _connection(self) -> WireConnection:
        endpoint = self.endpoint
        address = (endpoint.scheme, endpoint.host, endpoint.port)
        conn = getattr(self._local, "conn", None)
        if conn is not None and self._local.address != address:  # redirected elsewhere since
            conn.close()
            conn = None
        if conn is None:
            conn = WireConnection(endpoint.scheme, endpoint.host, endpoint.port, self.timeout)
            self._local.conn, self._local.address = conn, address
        return conn

    def _drop_connection(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def _attempt(self, byte_range: str, view: memoryview | None, start: int) -> bytes:
        """One GET, following redirects. ``view`` None: the suffix GET of ``start`` bytes, whose bytes are returned."""
        for _ in range(MAX_REDIRECTS + 1):
            pinned = self.version
            endpoint = self.endpoint
            target = endpoint.target(pinned.version_id if pinned else None)
            headers = {"Range": byte_range, "Accept-Encoding": "identity", **endpoint.headers(target)}
            if pinned is not None and pinned.etag is not None and not pinned.etag.startswith("W/"):
                headers["If-Match"] = pinned.etag  # a weak ETag never matches If-Match: the answer's is compared
            conn = self._connection()
            try:
                response = conn.get(target, headers)
                moved = endpoint.moved(response.status, response)
                if moved is None:
                    data = self._answer(response, byte_range, view, start)
                    if response.will_close:
                        self._drop_connection()
                    return data
                response.read(ERROR_BODY_BYTES)
                self._drop_connection()
                self.endpoint = moved
            except ssl.SSLCertVerificationError as exc:  # another attempt meets the same certificate
                self._drop_connection()
                raise PermanentError(f"TLS: {exc.verify_message or exc}") from None
            except (OSError, http.client.HTTPException) as exc:
                self._drop_connection()
                raise TransientError(_network_error(exc)) from None
            except BaseException:
                self._drop_connection()
                raise
        raise PermanentError(f"more than {MAX_REDIRECTS} redirects")

    def _answer(self, response: WireResponse, byte_range: str, view: memoryview | None,
                start: int) -> bytes:
        status = response.status
        if status == 206:
            first, last, size = self._content_range(response, byte_range)
        elif status == 200 and view is None and 0 < _length(response) <= start:
            size = _length(response)  # the whole object, no larger than the suffix asked: ranges may be ignored
            first, last = 0, size - 1
        elif status == 200:
            raise PermanentError(f"the server ignores Range requests (answered 200 with the whole object, "
                                 f"{_length(response)} bytes, to {byte_range}); refused rather than downloaded")
        elif status == 416 and view is None:
            raise PermanentError("the object is empty (416 to a suffix range)")
        elif status == 412:
            raise ObjectChangedError("the object was replaced since it was opened (If-Match failed); "
                                     + ObjectChangedError.REOPEN, self.endpoint.name)
        else:
            what = f"HTTP {status} {status_phrase(status, response.reason)}{_error_detail(response)}"
            if status in TRANSIENT_STATUS:
                raise TransientError(what)
            raise MissingError(what) if status in MISSING_STATUS else PermanentError(what)
        self._check_version(response, size)
        count = last - first + 1
        if view is None and (count > start or last != size - 1):
            raise PermanentError(f"asked for {byte_range}, the server sent bytes {first}-{last} of {size}")
        if view is None:
            buffer = bytearray(count)
            _read_exactly(response, memoryview(buffer))
            self.version = ObjectVersion(size, response.getheader("ETag"), response.getheader("x-amz-version-id"),
                                         _mtime_ns(response.getheader("Last-Modified")))
            return bytes(buffer)
        if (first, last) != (start, start + len(view) - 1):
            raise PermanentError(f"asked for {byte_range}, the server sent bytes {first}-{last}")
        _read_exactly(response, view)
        return b""

    def _content_range(self, response: WireResponse, byte_range: str) -> tuple[int, int, int]:
        header = response.getheader("Content-Range") or ""
        match = _CONTENT_RANGE.fullmatch(header.strip())
        if match is None:
            raise PermanentError(f"a 206 answer to {byte_range} with Content-Range {header!r}")
        first, last, size = (int(g) for g in match.groups())
        if last < first or last >= size or _length(response) != last - first + 1:
            raise PermanentError(f"a 206 answer to {byte_range} with Content-Range {header!r} and "
                                 f"Content-Length {_length(response)}")
        return first, last, size

    def _check_version(self, response: WireResponse, size: int) -> None:
        """A server that does not honour If-Match still says what it sent: another version is refused."""
        pinned = self.version
        if pinned is None:
            return
        etag, version_id = response.getheader("ETag"), response.getheader("x-amz-version-id")
        if size != pinned.size or (etag and pinned.etag and etag != pinned.etag) or (
                version_id and pinned.version_id and version_id != pinned.version_id):
            raise ObjectChangedError(f"the object was replaced since it was opened (now {size} bytes, ETag {etag}); "
                                     + ObjectChangedError.REOPEN, self.endpoint.name)


def status_phrase(status: int, reason: str) -> str:
    """The standard reason phrase (servers spell their own: moto's ``NOT FOUND``)."""
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return reason


def _length(response: WireResponse) -> int:
    text = response.getheader("Content-Length")
    return int(text) if text is not None and text.isdigit() else -1


def _read_exactly(response: WireResponse, view: memoryview) -> None:
    got = 0
    while got < len(view):
        count = response.readinto(view[got:])
        if not count:
            raise TransientError(f"short body: {got} of {len(view)} bytes")
        got += count


def _error_detail(response: WireResponse) -> str:
    """The S3 error code of an error answer (``NoSuchKey``, ``SlowDown`` ...), if it names one."""
    try:
        body = response.read(ERROR_BODY_BYTES)
    except (OSError, http.client.HTTPException):
        return ""
    match = _ERROR_CODE.search(body)
    return f" ({match.group(1).decode()})" if match else ""


def _network_error(exc: BaseException) -> str:
    if isinstance(exc, socket.timeout):
        return "timed out"
    if isinstance(exc, http.client.IncompleteRead):
        return f"short body: {len(exc.partial)} bytes, {exc.expected} more expected"
    return getattr(exc, "strerror", None) or type(exc).__name__ + (f": {exc}" if str(exc) else "")


def _mtime_ns(text: str | None) -> int | None:
    if not text:
        return None
    try:
        return int(email.utils.parsedate_to_datetime(text).timestamp()) * 10**9
    except (TypeError, ValueError):
        return None
