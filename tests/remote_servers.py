"""Real servers on 127.0.0.1 for the remote-source tests, started and stopped by fixtures.

* ``nginx``: nginx-light serving a directory; its access log (one line a request: method, path, Range, status,
  body bytes sent, If-Match) counts requests and bytes.
* ``fault_proxy``: a proxy in front of nginx that answers each request as its script says (a 503, a reset,
  a short body, a 200 ignoring the range, a slow answer), then forwards faithfully.
* ``moto_s3``: moto's S3 server, checking SigV4 signatures (versioned buckets, If-Match).
* ``radosgw``: Ceph's production S3 gateway on a one-node in-memory cluster.

Missing programs fail the tests under CI=true and skip them elsewhere.
"""

from __future__ import annotations

import http.client
import itertools
import http.server
import json
import os
import random
import shutil
import socket
import socketserver
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator, NamedTuple

import pytest

LOG_FORMAT = "'$request_method $uri \"$http_range\" $status $body_bytes_sent \"$http_if_match\"'"


class Request(NamedTuple):
    method: str
    path: str
    range: str
    status: int
    sent: int
    if_match: str


def _missing(what: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} is missing (scripts/setup --test installs it)")
    pytest.skip(f"{what} is missing (scripts/setup --test installs it)")


_HANDED_OUT: set[int] = set()
_PICK = random.SystemRandom()


def _ephemeral_ports() -> range:
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def free_port() -> int:
    """A port nothing listens on, for a server started next. It lies outside the kernel's ephemeral range: a port
    the kernel hands out (what ``bind(0)`` gives) can be taken as the local end of any outgoing connection before
    the server binds it. No port is handed out twice in a run."""
    ephemeral = _ephemeral_ports()
    while True:
        port = _PICK.randrange(10000, 32768)
        if port in _HANDED_OUT or port in ephemeral:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port


def wait_for_port(port: int, process: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with status {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port} after {timeout} s")


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class Nginx:
    def __init__(self, base: Path, upstream: str | None = None, limit_rate: str | None = None) -> None:
        """Serves ``base/www``, or with ``upstream`` (a URL) is a proxy in front of it, logging each request alike
        (the Host header passed on, so that S3 signatures made for the proxy's address check). ``limit_rate``
        (nginx's, ``40m``: bytes a second) caps each answer, as object stores cap each connection."""
        self.root = base / "www"
        self.root.mkdir()
        self.log = base / "access.log"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.tls_port = free_port()
        self.tls_url = f"https://127.0.0.1:{self.tls_port}"
        self.certificate = base / "cert.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                        "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(base / "key.pem"),
                        "-out", str(self.certificate)], check=True, capture_output=True)
        config = base / "nginx.conf"
        config.write_text(f"""
master_process off;
daemon off;
pid {base}/nginx.pid;
error_log {base}/error.log;
events {{ worker_connections 256; }}
http {{
    log_format counted {LOG_FORMAT};
    access_log {self.log} counted;
    sendfile on;
    tcp_nodelay on;
    keepalive_requests 100000;
    {f"limit_rate {limit_rate};" if limit_rate else ""}
    client_body_temp_path {base}/tmp;
    proxy_temp_path {base}/tmp;
    fastcgi_temp_path {base}/tmp;
    uwsgi_temp_path {base}/tmp;
    scgi_temp_path {base}/tmp;
    server {{
        listen 127.0.0.1:{self.port};
        listen 127.0.0.1:{self.tls_port} ssl;
        ssl_certificate {self.certificate};
        ssl_certificate_key {base}/key.pem;
        {self._serving(upstream)}
    }}
}}
""")
        self.process = subprocess.Popen([self.binary(), "-p", str(base), "-c", str(config), "-e", f"{base}/error.log"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_for_port(self.port, self.process)

    def _serving(self, upstream: str | None) -> str:
        if upstream is None:
            return f"root {self.root};"
        return (f"location / {{ proxy_pass {upstream}; proxy_set_header Host $http_host; proxy_http_version 1.1; "
                f"proxy_set_header Connection \"\"; proxy_buffering off; }}")

    @staticmethod
    def binary() -> str:
        return shutil.which("nginx") or "/usr/sbin/nginx"

    def requests(self) -> list[Request]:
        """Every request logged so far."""
        found = []
        for line in self.log.read_text().splitlines():
            method, path, rest = line.split(" ", 2)
            quoted_range, status, sent, if_match = rest.rsplit(" ", 3)
            byte_range = "" if quoted_range == '"-"' else quoted_range.strip('"')
            found.append(Request(method, path, byte_range, int(status), int(sent), if_match.strip('"')))
        return found

    def since(self, mark: int, at_least: int = 0) -> list[Request]:
        """The requests logged after ``mark``, waiting (up to 10 s) until ``at_least`` are and no more came for
        50 ms: nginx logs a request after sending its response, so a client can have its bytes before the line is
        written."""
        deadline = time.monotonic() + 10
        found = self.requests()[mark:]
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            if len(found) >= at_least and time.monotonic() - quiet_since >= 0.05:
                break
            time.sleep(0.01)
            again = self.requests()[mark:]
            if len(again) != len(found):
                found, quiet_since = again, time.monotonic()
        return found

    def mark(self) -> int:
        """How many requests are logged, once the lines of those answered already are."""
        return len(self.since(0))


def nginx_server(base: Path, upstream: str | None = None) -> Iterator[Nginx]:
    if not os.path.exists(Nginx.binary()):
        _missing("nginx (apt-get install nginx-light)")
    if shutil.which("openssl") is None:
        _missing("openssl (apt-get install openssl)")
    server = Nginx(base, upstream)
    try:
        yield server
    finally:
        stop(server.process)


class FaultProxy:
    """Forwards GETs to ``upstream``; ``faults`` (consumed one a request) says what to do instead:
    ``503``, ``reset`` (close without an answer), ``short`` (half the body, then close), ``ignore-range``
    (a 200 with the whole object), ``slow`` (wait ``slow_seconds`` first), ``redirect`` (a 302 to nginx itself),
    ``other-etag`` (the bytes asked, If-Match not passed on, under another ETag: another version, from a server
    that ignores If-Match). ``most_active``: the most GETs it answered at once."""

    def __init__(self, upstream_port: int) -> None:
        self.faults: list[str] = []
        self.seen: list[tuple[str, str]] = []
        """(range, fault) of every request."""
        self.ignored_range_bytes_sent = 0
        self.slow_seconds = 2.0
        self.active = self.most_active = 0
        lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                with lock:
                    fault = proxy.faults.pop(0) if proxy.faults else ""
                    proxy.seen.append((self.headers.get("Range", ""), fault))
                    proxy.active += 1
                    proxy.most_active = max(proxy.most_active, proxy.active)
                try:
                    self.answer(fault)
                finally:
                    with lock:
                        proxy.active -= 1

            def answer(self, fault: str) -> None:
                if fault == "503":
                    body = b"<Error><Code>SlowDown</Code></Error>"
                    self.send_response(503)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                if fault == "redirect":
                    self.send_response(302)
                    self.send_header("Location", f"http://127.0.0.1:{upstream_port}{self.path}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if fault == "reset":
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.close_connection = True
                    return
                if fault == "slow":
                    time.sleep(proxy.slow_seconds)
                headers = {k: v for k, v in self.headers.items() if k in ("Range", "If-Match")}
                if fault == "ignore-range":
                    headers.pop("Range", None)
                if fault == "other-etag":
                    headers.pop("If-Match", None)
                upstream = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=30)
                upstream.request("GET", self.path, headers=headers)
                answer = upstream.getresponse()
                body = answer.read()
                upstream.close()
                self.send_response(answer.status)
                for name in ("Content-Range", "ETag", "Last-Modified", "Content-Length"):
                    if answer.getheader(name) is not None:
                        value = answer.getheader(name)
                        self.send_header(name, '"another-version"' if fault == "other-etag" and name == "ETag"
                                         else value)
                self.end_headers()
                if fault == "short":
                    self.wfile.write(body[: len(body) // 2])
                    self.close_connection = True
                    return
                try:
                    for at in range(0, len(body), 65536):
                        self.wfile.write(body[at : at + 65536])
                        if fault == "ignore-range":
                            proxy.ignored_range_bytes_sent = at + 65536
                except OSError:
                    self.close_connection = True

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class MotoS3:
    """moto's S3 server checking SigV4 signatures: its first three requests (unchecked) make an IAM user allowed
    s3:*, whose keys ``env`` holds and ``client`` (boto3) signs with."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3"})
        wait_for_port(self.port, self.process, timeout=60)
        import boto3

        iam = boto3.client("iam", endpoint_url=self.url, region_name="us-east-1", aws_access_key_id="bootstrap",
                           aws_secret_access_key="bootstrap")
        iam.create_user(UserName="reader")
        key = iam.create_access_key(UserName="reader")["AccessKey"]
        iam.put_user_policy(UserName="reader", PolicyName="s3", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
        self.env = {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
                    "AWS_REGION": "us-east-1"}
        self.client = boto3.client("s3", endpoint_url=self.url, region_name="us-east-1",
                                   aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"])


def moto_server() -> Iterator[MotoS3]:
    try:
        import boto3  # noqa: F401
        import moto.server  # noqa: F401
    except ImportError:
        _missing("moto[server] (pip install -e '.[test]')")
    server = MotoS3()
    try:
        yield server
    finally:
        stop(server.process)


@pytest.fixture(scope="session")
def nginx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nginx]:
    base = tmp_path_factory.mktemp("nginx")
    os.chmod(base, 0o755)
    yield from nginx_server(base)


@pytest.fixture
def fault_proxy(nginx: Nginx) -> Iterator[FaultProxy]:
    proxy = FaultProxy(nginx.port)
    try:
        yield proxy
    finally:
        proxy.close()


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3]:
    yield from moto_server()


@pytest.fixture(scope="session")
def moto_proxy(moto_s3: MotoS3, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nginx]:
    """nginx in front of moto: its access log counts the requests and bytes an S3 client makes."""
    base = tmp_path_factory.mktemp("moto-proxy")
    os.chmod(base, 0o755)
    yield from nginx_server(base, moto_s3.url)


@pytest.fixture
def s3_env(moto_s3: MotoS3, monkeypatch: pytest.MonkeyPatch) -> MotoS3:
    """moto's keys and endpoint in the environment, as the AWS chain finds them."""
    for name, value in moto_s3.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_s3.url)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return moto_s3


RADOSGW_PROGRAMS = ("monmaptool", "ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "ceph")


class Radosgw:
    """Ceph's radosgw on a one-node cluster kept in memory (one monitor, one memstore OSD), ~20 s to start.
    ``ms mon client mode = crc`` and beast's ``tcp_nodelay=1`` keep small GETs from waiting ~45 ms."""

    ACCESS_KEY, SECRET_KEY = "AKCKPTFSTEST", "ckptfs-test-secret"

    def __init__(self, base: Path, memory: int = 1 << 30) -> None:
        """``memory``: bytes the in-memory OSD holds (the benchmark's 1 GiB checkpoint needs more)."""
        self.base = base
        self.url = f"http://127.0.0.1:{free_port()}"
        mon_port = free_port()
        fsid = "5c1a1e6e-0c4b-4b39-9f59-2f8f6d3f3b11"
        self.config = base / "ceph.conf"
        self.config.write_text(f"""[global]
fsid = {fsid}
mon host = v1:127.0.0.1:{mon_port}
ms bind msgr2 = false
ms mon client mode = crc
auth cluster required = none
auth service required = none
auth client required = none
auth allow insecure global id reclaim = true
keyring = {base}/keyring
osd objectstore = memstore
memstore device bytes = {memory}
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
mon max pg per osd = 1000
osd class update on start = false
osd crush update on start = false
run dir = {base}/run
admin socket = {base}/run/$name.asok
log file = {base}/log/$name.log
pid file = {base}/run/$name.pid
setuser match path = {base}
mon data = {base}/mon
osd data = {base}/osd
rgw data = {base}/rgw
rgw frontends = beast endpoint={self.url[len("http://"):]} tcp_nodelay=1
""")
        for name in ("run", "log", "mon", "osd", "rgw"):
            (base / name).mkdir()
        self.processes: list[subprocess.Popen] = []
        try:
            self._start_cluster(mon_port, fsid)
        except BaseException:
            self.close()
            raise
        self.env = {"AWS_ACCESS_KEY_ID": self.ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": self.SECRET_KEY,
                    "AWS_REGION": "us-east-1"}
        import boto3

        self.client = boto3.client("s3", endpoint_url=self.url, region_name="us-east-1",
                                   aws_access_key_id=self.ACCESS_KEY, aws_secret_access_key=self.SECRET_KEY)

    def _start_cluster(self, mon_port: int, fsid: str) -> None:
        base = self.base
        conf = ["-c", str(self.config)]
        self._run("monmaptool", "--create", "--addv", "a", f"[v1:127.0.0.1:{mon_port}]", "--fsid", fsid,
                  str(base / "monmap"))
        self._run("ceph-mon", *conf, "--mkfs", "-i", "a", "--monmap", str(base / "monmap"))
        self._start("ceph-mon", *conf, "-f", "-i", "a")
        wait_for_port(mon_port, self.processes[-1])
        osd_uuid = "0b7c1f52-4a8e-4d0c-9a57-6f1f3f0d2c01"  # the OSD's, registered and made with it alike
        self._run("ceph", *conf, "--connect-timeout", "30", "osd", "create", osd_uuid, "0")
        # Placed by hand: an OSD placing itself races its first monitor map ("wrong fsid") now and then.
        self._run("ceph", *conf, "--connect-timeout", "30", "osd", "crush", "add", "osd.0", "1.0", "root=default",
                  "host=local")
        self._run("ceph-osd", *conf, "-i", "0", "--mkfs", "--osd-uuid", osd_uuid)
        self._start("ceph-osd", *conf, "-f", "-i", "0")
        self._run("ceph", *conf, "--connect-timeout", "30", "osd", "pool", "ls")
        self._start("radosgw", *conf, "-f", "-n", "client.rgw")
        wait_for_port(int(self.url.rpartition(":")[2]), self.processes[-1], timeout=90)
        self._run("radosgw-admin", *conf, "user", "create", "--uid", "ckptfs", "--display-name", "ckptfs",
                  "--access-key", self.ACCESS_KEY, "--secret-key", self.SECRET_KEY)

    def _run(self, *command: str) -> None:
        done = subprocess.run(command, capture_output=True, timeout=90, cwd=self.base)
        if done.returncode != 0:  # what the tool said, which CalledProcessError's message leaves out
            said = (done.stderr + done.stdout).decode(errors="replace")[-2000:]
            raise RuntimeError(f"{' '.join(command)} exited {done.returncode}: {said}")

    def _start(self, *command: str) -> None:
        self.processes.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                               cwd=self.base))

    def close(self) -> None:
        for process in reversed(self.processes):
            stop(process)


@pytest.fixture(scope="session")
def radosgw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Radosgw]:
    missing = [name for name in RADOSGW_PROGRAMS if shutil.which(name) is None]
    if missing:
        _missing(f"{', '.join(missing)} (apt-get install radosgw ceph-mon ceph-osd ceph-common)")
    server = Radosgw(tmp_path_factory.mktemp("radosgw"))
    try:
        yield server
    finally:
        server.close()


def timed_gets(source: Any, seconds: float) -> None:
    """From now on every GET of the remote ``source`` takes ``seconds`` to its rate measure (``PartPool``): a
    made-up connection rate, the ones measured so far forgotten."""
    clock = itertools.count(0.0, seconds)
    source._parts.clock = lambda: next(clock)  # noqa: SLF001
    source._parts._samples.clear()  # noqa: SLF001
