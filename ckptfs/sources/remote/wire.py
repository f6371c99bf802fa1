"""A lean HTTP/1.1 client connection for ranged GETs: the request written in one ``send``, the status line and
headers parsed by hand, the body read straight into the caller's buffer.

``http.client`` writes a request in several calls and parses every answer's headers with the ``email`` package;
a 4 KiB read through a mount is one GET, and those costs were a sixth of its latency on loopback (docs/remote.md).
Only what ranged GETs need: a body framed by Content-Length (the answers read to their end, 206s, have one;
an answer without is read to the connection's close and the connection dropped after).
A malformed or oversized answer raises ``http.client`` exceptions, as ``http.client`` would.
"""

from __future__ import annotations

import http.client
import io
import socket
import ssl

MAX_LINE = 65536
MAX_HEADERS = 100


class WireResponse:
    """An answer's status, headers and body, the ``http.client.HTTPResponse`` methods ranged GETs use."""

    __slots__ = ("status", "reason", "_headers", "_file", "_left", "will_close")

    def __init__(self, status: int, reason: str, headers: dict[str, str], file: io.BufferedReader,
                 left: int | None, will_close: bool) -> None:
        self.status = status
        self.reason = reason
        self._headers = headers
        self._file = file
        self._left = left
        """Body bytes not read yet; None: until the connection closes."""
        self.will_close = will_close

    def getheader(self, name: str, default: str | None = None) -> str | None:
        return self._headers.get(name.lower(), default)

    def readinto(self, view: memoryview) -> int:
        if self._left is not None:
            if self._left <= 0:
                return 0
            view = view[: self._left]
        count = self._file.readinto(view)
        if self._left is not None:
            if not count:
                raise http.client.IncompleteRead(b"", self._left)
            self._left -= count
        return count or 0

    def read(self, amount: int) -> bytes:
        """At most ``amount`` bytes of the body (an error answer's, for its S3 error code)."""
        buffer = bytearray(amount if self._left is None else min(amount, self._left))
        view = memoryview(buffer)
        got = 0
        while got < len(buffer):
            count = self.readinto(view[got:])
            if not count:
                break
            got += count
        return bytes(buffer[:got])


class WireConnection:
    """One keep-alive connection to ``host:port``, made on the first request (and again after a close)."""

    def __init__(self, scheme: str, host: str, port: int, timeout: float) -> None:
        self.scheme, self.host, self.port, self.timeout = scheme, host, port, timeout
        default = 443 if scheme == "https" else 80
        name = f"[{host}]" if ":" in host else host
        try:
            name.encode("ascii")
        except UnicodeEncodeError:
            name = name.encode("idna").decode("ascii")
        self._host_header = name if port == default else f"{name}:{port}"
        self._sock: socket.socket | None = None
        self._file: io.BufferedReader | None = None

    def get(self, target: str, headers: dict[str, str]) -> WireResponse:
        """Sends ``GET target`` with ``headers`` (and Host) and reads the answer's status line and headers."""
        lines = [f"GET {target} HTTP/1.1", f"Host: {self._host_header}"]
        lines += [f"{key}: {value}" for key, value in headers.items()]
        if " " in target or any("\r" in line or "\n" in line for line in lines):
            raise ValueError(f"a request target or header value with a space or line break: {lines!r}")
        if self._sock is None:
            self._connect()
        assert self._sock is not None
        self._sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        return self._answer()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock = self._file = None

    def _connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), self.timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.scheme == "https":
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=self.host)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._file = sock.makefile("rb")

    def _line(self) -> bytes:
        assert self._file is not None
        line = self._file.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise http.client.LineTooLong("header line")
        return line

    def _answer(self) -> WireResponse:
        status_line = self._line()
        if not status_line:
            raise http.client.RemoteDisconnected("the server closed the connection without an answer")
        parts = status_line.decode("latin-1").rstrip("\r\n").split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not (len(parts[1]) == 3 and parts[1].isdigit()):
            raise http.client.BadStatusLine(status_line.decode("latin-1", "replace").rstrip())
        headers: dict[str, str] = {}
        for _ in range(MAX_HEADERS + 1):
            line = self._line()
            if line in (b"\r\n", b"\n", b""):
                break
            name, colon, value = line.decode("latin-1").partition(":")
            if not colon:
                raise http.client.HTTPException(f"a malformed header line: {line[:100]!r}")
            key = name.strip().lower()
            value = value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        else:
            raise http.client.HTTPException(f"more than {MAX_HEADERS} headers")
        status = int(parts[1])
        length_text = headers.get("content-length")
        left = int(length_text) if length_text is not None and length_text.isdigit() else None
        if "transfer-encoding" in headers:
            if 200 <= status < 300:
                # Its body is framed by the coding, not Content-Length: read raw, the framing would be served as
                # data. Ranged answers are sent with a Content-Length by every store.
                raise http.client.HTTPException(f"a {status} answer with Transfer-Encoding "
                                                f"{headers['transfer-encoding']!r}: refused as a ranged body")
            left = None  # read raw to the close: only an error answer's first bytes are read, for its code
        will_close = (left is None or parts[0] == "HTTP/1.0" or headers.get("connection", "").lower() == "close")
        assert self._file is not None
        return WireResponse(status, parts[2] if len(parts) > 2 else "", headers, self._file, left,
                            will_close)
