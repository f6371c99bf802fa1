"""A plain http(s):// URL as an endpoint: the request target is the URL's path and query, as given."""

from __future__ import annotations

import urllib.parse
from typing import TYPE_CHECKING

from ckptfs.errors import SourceError
from ckptfs.sources.remote.options import public_name

if TYPE_CHECKING:
    from ckptfs.sources.remote.ranged_get import Answer


class HttpEndpoint:
    def __init__(self, url: str, name: str | None = None) -> None:
        parts = urllib.parse.urlsplit(url)
        self.name = name or public_name(url)
        self._url = url
        self.scheme = parts.scheme.lower()
        if not parts.hostname:
            raise SourceError("no host in the URL", self.name)
        self.host = parts.hostname
        try:
            self.port = parts.port or (443 if self.scheme == "https" else 80)
        except ValueError:
            raise SourceError("the URL's port is not a number from 0 to 65535", self.name) from None
        self._target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._authorization = _basic_authorization(parts)

    def target(self, version_id: str | None) -> str:
        return self._target

    def headers(self, target: str) -> dict[str, str]:
        return {"Authorization": self._authorization} if self._authorization else {}

    def moved(self, status: int, response: Answer) -> HttpEndpoint | None:
        """A redirect's target (a CDN, a presigned URL), under the first URL's name; credentials go to the first
        host only."""
        location = response.getheader("Location")
        if status not in (301, 302, 303, 307, 308) or not location:
            return None
        url = urllib.parse.urljoin(self._url, location)
        if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            return None
        moved = HttpEndpoint(url, self.name)
        moved._authorization = self._authorization if (moved.host, moved.port) == (self.host, self.port) else None
        return moved


def _basic_authorization(parts: urllib.parse.SplitResult) -> str | None:
    if parts.username is None:
        return None
    import base64

    user = urllib.parse.unquote(parts.username)
    password = urllib.parse.unquote(parts.password or "")
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
