"""The lean HTTP/1.1 connection of ranged GETs (``wire``): against nginx, and against a scripted server sending
malformed, oversized and closing answers."""

from __future__ import annotations

import os
import socket
import threading
from typing import Iterator

import pytest
from remote_servers import Nginx

from ckptfs.errors import SourceError
from ckptfs.sources import open_source
from ckptfs.sources.remote.wire import MAX_HEADERS, MAX_LINE, WireConnection


class ScriptedServer:
    """Answers each request on 127.0.0.1 with the next raw answer of ``answers``; closes the connection after one
    ending in ``CLOSE``. Counts connections and keeps the requests' heads."""

    CLOSE = b"<close>"

    def __init__(self, answers: list[bytes]) -> None:
        self.answers = answers
        self.connections = 0
        self.requests: list[bytes] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                pending = b""
                while self.answers:
                    while b"\r\n\r\n" not in pending:
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        pending += chunk
                    if b"\r\n\r\n" not in pending:
                        break
                    head, _, pending = pending.partition(b"\r\n\r\n")
                    self.requests.append(head)
                    answer = self.answers.pop(0)
                    conn.sendall(answer.removesuffix(self.CLOSE))
                    if answer.endswith(self.CLOSE):
                        break

    def close(self) -> None:
        self._listener.close()


@pytest.fixture
def scripted() -> Iterator[list[ScriptedServer]]:
    servers: list[ScriptedServer] = []
    yield servers
    for server in servers:
        server.close()


def serve(servers: list[ScriptedServer], answers: list[bytes]) -> ScriptedServer:
    server = ScriptedServer(answers)
    servers.append(server)
    return server


def partial(body: bytes, first: int, size: int, extra: bytes = b"") -> bytes:
    return (f"HTTP/1.1 206 Partial Content\r\nContent-Length: {len(body)}\r\nETag: \"e1\"\r\n"
            f"Content-Range: bytes {first}-{first + len(body) - 1}/{size}\r\n").encode() + extra + b"\r\n" + body


def test_ranged_gets_over_one_kept_alive_connection_read_what_nginx_serves(nginx: Nginx) -> None:
    blob = os.urandom(300_000)
    (nginx.root / "wire.bin").write_bytes(blob)
    conn = WireConnection("http", "127.0.0.1", nginx.port, 10)
    try:
        for first in (0, 123_456, 299_000):
            answer = conn.get("/wire.bin", {"Range": f"bytes={first}-{first + 999}"})
            assert (answer.status, answer.reason, answer.will_close) == (206, "Partial Content", False)
            assert answer.getheader("content-range") == f"bytes {first}-{min(first + 999, len(blob) - 1)}/300000"
            view = memoryview(bytearray(int(answer.getheader("Content-Length") or 0)))
            got = 0
            while got < len(view):
                got += answer.readinto(view[got:])
            assert answer.readinto(memoryview(bytearray(10))) == 0  # the body ends at its length
            assert view == blob[first : first + 1000]
    finally:
        conn.close()


def test_the_request_is_one_head_with_host_and_the_headers_given(scripted: list[ScriptedServer]) -> None:
    server = serve(scripted, [partial(b"abc", 0, 3)])
    answer = WireConnection("http", "127.0.0.1", server.port, 10).get("/b/k%20y?versionId=7", {"Range": "bytes=0-2"})
    assert answer.read(100) == b"abc"
    assert server.requests == [f"GET /b/k%20y?versionId=7 HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
                               "Range: bytes=0-2".encode()]


def test_a_closing_answer_drops_the_connection_and_the_next_get_makes_another(scripted: list[ScriptedServer]) -> None:
    blob = os.urandom(100_000)
    server = serve(scripted, [partial(blob[-1000:], 99_000, 100_000, b"Connection: close\r\n") + ScriptedServer.CLOSE,
                              partial(blob[:65536], 0, 100_000)])
    source = open_source(f"http://127.0.0.1:{server.port}/x.bin")
    assert source.read(0, 5000) == blob[:5000]
    assert server.connections == 2


@pytest.mark.parametrize(("answer", "message"), [
    (b"HTTP/1.1 2x6 Partial\r\n\r\n", r"BadStatusLine"),
    (b"SSH-2.0-OpenSSH\r\n\r\n", r"BadStatusLine"),
    (b"HTTP/1.1 206 Partial\r\nX: " + b"y" * MAX_LINE + b"\r\n\r\n", r"LineTooLong"),
    (b"HTTP/1.1 206 Partial\r\n" + b"X: y\r\n" * (MAX_HEADERS + 1) + b"\r\n", rf"more than {MAX_HEADERS} headers"),
    (b"HTTP/1.1 206 Partial\r\nno colon here\r\n\r\n", r"a malformed header line"),
    (b"", r"RemoteDisconnected"),
    (partial(b"abc", 0, 3)[:-1], r"short body: 0 bytes, 1 more expected"),
    (partial(b"abc", 0, 3, b"Content-Length: 4\r\n"), r"and Content-Length -1$"),  # two lengths: refused
    # a length that matches the range, but the body is chunked: its framing must never be read as data
    (partial(b"3\r\nabc\r\n0\r\n\r\n"[:3], 0, 3, b"Transfer-Encoding: chunked\r\n") + b"\r\nabc\r\n0\r\n\r\n",
     r"a 206 answer with Transfer-Encoding 'chunked': refused as a ranged body"),
])
def test_a_malformed_answer_is_retried_then_refused_never_read(scripted: list[ScriptedServer], answer: bytes,
                                                                message: str) -> None:
    server = serve(scripted, [answer + ScriptedServer.CLOSE] * 6)  # each attempt meets it
    with pytest.raises(SourceError, match=message):
        open_source(f"http://127.0.0.1:{server.port}/x.bin")


def test_a_header_value_with_a_line_break_is_never_sent() -> None:
    conn = WireConnection("http", "127.0.0.1", 9, 1)
    with pytest.raises(ValueError, match="line break"):
        conn.get("/x", {"If-Match": "\"e\"\r\nX-Injected: 1"})
    with pytest.raises(ValueError, match="line break"):
        conn.get("/x y", {})


def test_an_answer_without_length_is_read_to_the_close() -> None:
    ours, theirs = socket.socketpair()
    theirs.sendall(b"HTTP/1.0 403 Forbidden\r\n\r\n<Error><Code>AccessDenied</Code></Error>")
    theirs.close()
    conn = WireConnection("http", "127.0.0.1", 9, 1)
    conn._sock, conn._file = ours, ours.makefile("rb")  # noqa: SLF001
    try:
        answer = conn._answer()  # noqa: SLF001
        assert (answer.status, answer.reason, answer.will_close) == (403, "Forbidden", True)
        assert answer.read(4096) == b"<Error><Code>AccessDenied</Code></Error>"
    finally:
        conn.close()
