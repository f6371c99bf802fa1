"""``scripts/bench --remote``: ckptfs mounts of s3:// URLs against S3 clients reading the same bytes.

nginx on 127.0.0.1 serves the benchmark's checkpoints as a path-style, read-only S3 stand-in (it ignores
signatures; its access log counts requests). For each: ``ckptfs mount`` of the 1 GiB and the 20,000-tensor
checkpoints (requests, seconds); the first sequential read (``cat``) of the 1 GiB tensor through a fresh mount
against one ranged GET of the same bytes by boto3, obstore's ``get_range`` and s3torchconnector's sequential
and range-based readers (``force_path_style``, dummy credentials); ``np.memmap(...).sum()`` through a fresh
mount; random 4 KiB ``pread``s through a mount against bare keep-alive ranged GETs (``http.client``).
Ratios against issue 13's targets. The clients are bench-only: ``scripts/bench --remote`` installs them.
"""
from __future__ import annotations

import contextlib
import gc
import http.client
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

if TYPE_CHECKING:
    from bench import Bench

MiB = 1 << 20
BUCKET = "bkt"
RANDOM_READS = 300
CLIENTS = ("boto3", "obstore", "s3tc_sequential", "s3tc_range")
DUMMY_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_REGION": "us-east-1"}


class NginxS3:
    """nginx serving ``root`` on a free loopback port; ``root/bkt/KEY`` answers path-style S3 GETs."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.root = base / "www"
        (self.root / BUCKET).mkdir(parents=True, exist_ok=True)
        self.log = base / "access.log"
        self.log.write_text("")
        import socket

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = base / "nginx.conf"
        temp = base / "tmp"
        config.write_text(f"""
master_process off;
daemon off;
pid {base}/nginx.pid;
error_log {base}/error.log;
events {{ worker_connections 256; }}
http {{
    log_format counted '$request_method $uri "$http_range" $status $body_bytes_sent';
    access_log {self.log} counted;
    sendfile on;
    tcp_nodelay on;
    keepalive_requests 1000000;
    client_body_temp_path {temp}; proxy_temp_path {temp}; fastcgi_temp_path {temp};
    uwsgi_temp_path {temp}; scgi_temp_path {temp};
    server {{ listen 127.0.0.1:{self.port}; root {self.root}; }}
}}
""")
        binary = shutil.which("nginx") or "/usr/sbin/nginx"
        self.process = subprocess.Popen([binary, "-p", str(base), "-c", str(config), "-e", f"{base}/error.log"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 20
        while True:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            if self.process.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"nginx did not start: {(base / 'error.log').read_text()[-500:]}")
            time.sleep(0.05)

    def publish(self, path: str, key: str) -> None:
        target = self.root / BUCKET / key
        with contextlib.suppress(FileNotFoundError):
            target.unlink()
        try:
            os.link(path, target)
        except OSError:
            shutil.copyfile(path, target)

    def mark(self) -> int:
        return len(self.log.read_text().splitlines())

    def since(self, mark: int) -> list[tuple[str, int]]:
        """(range, bytes sent) of each GET since ``mark``."""
        found = []
        for line in self.log.read_text().splitlines()[mark:]:
            method, _, rest = line.split(" ", 2)
            quoted, _status, sent = rest.rsplit(" ", 2)
            if method == "GET":
                found.append((quoted.strip('"'), int(sent)))
        return found

    def close(self) -> None:
        self.process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        if self.process.poll() is None:
            self.process.kill()


def ensure_clients() -> list[str]:
    """The clients importable here (``scripts/bench --remote`` pip-installs them first)."""
    present = []
    for module, names in (("boto3", ["boto3"]), ("obstore", ["obstore"]),
                          ("s3torchconnector", ["s3tc_sequential", "s3tc_range"])):
        try:
            __import__(module)
            present += names
        except ImportError:
            pass
    return present


def client_readers(url: str, key: str) -> dict[str, Callable[[int, int], int]]:
    """name -> read(offset, length) giving the bytes read, one client each, made once (its connections warm)."""
    os.environ.update({k: os.environ.get(k, v) for k, v in DUMMY_CREDENTIALS.items()})
    readers: dict[str, Callable[[int, int], int]] = {}
    present = ensure_clients()
    if "boto3" in present:
        import boto3
        from botocore import UNSIGNED
        from botocore.config import Config

        client = boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                              config=Config(signature_version=UNSIGNED, s3={"addressing_style": "path"}))

        def boto(offset: int, length: int) -> int:
            body = client.get_object(Bucket=BUCKET, Key=key, Range=f"bytes={offset}-{offset + length - 1}")["Body"]
            return len(body.read())

        readers["boto3"] = boto
    if "obstore" in present:
        import obstore
        from obstore.store import S3Store

        store = S3Store(BUCKET, endpoint=url, skip_signature=True, virtual_hosted_style_request=False,
                        region="us-east-1", client_options={"allow_http": True})
        readers["obstore"] = lambda offset, length: len(obstore.get_range(store, key, start=offset,
                                                                          end=offset + length))
    if "s3tc_sequential" in present:
        from s3torchconnector import S3ReaderConstructor
        from s3torchconnector._s3client import S3Client, S3ClientConfig

        s3 = S3Client("us-east-1", endpoint=url, s3client_config=S3ClientConfig(force_path_style=True))

        def s3tc(constructor: Any) -> Callable[[int, int], int]:
            def read(offset: int, length: int) -> int:
                reader = s3.get_object(BUCKET, key, reader_constructor=constructor)
                reader.seek(offset)
                got = 0
                while got < length:
                    chunk = reader.read(min(64 * MiB, length - got))
                    if not chunk:
                        break
                    got += len(chunk)
                return got
            return read

        readers["s3tc_sequential"] = s3tc(S3ReaderConstructor.sequential())
        readers["s3tc_range"] = s3tc(S3ReaderConstructor.range_based())
    return readers


class RemoteBench:
    def __init__(self, bench: Bench) -> None:
        self.bench = bench
        self.runs = bench.args.runs
        self.figures: dict[str, list[float]] = {}
        self.units: dict[str, str] = {}

    def add(self, key: str, value: float, unit: str) -> None:
        self.figures.setdefault(key, []).append(value)
        self.units[key] = unit

    def median(self, key: str) -> float | None:
        values = self.figures.get(key)
        return statistics.median(values) if values else None

    def mount(self, server: NginxS3, key: str, tag: str) -> tuple[Any, int]:
        """A fresh ckptfs mount of s3://bkt/KEY; the GETs it made."""
        bench = self.bench
        assert bench.mounts is not None
        mnt = str(bench.workdir / "mnt" / tag)
        argv, env = bench.ckptfs_argv(f"s3://{BUCKET}/{key}", mnt)
        argv += ["--endpoint-url", server.url, "--anonymous"]
        mark = server.mark()
        m = bench.mounts.start(tag, argv, mnt, env=env, daemon=bench.args.mount_mode == "daemon")
        return m, len(server.since(mark))

    def run(self) -> str:
        bench = self.bench
        server = NginxS3(bench.workdir / "remote-nginx")
        try:
            server.publish(bench.big, "big.pt")
            server.publish(bench.many, "many.pt")
            self.measure(server)
        finally:
            server.close()
        return self.table()

    def measure(self, server: NginxS3) -> None:
        bench = self.bench
        assert bench.mounts is not None
        offset, length = bench.big_off, bench.big_len
        gb = length / 1e9
        readers = client_readers(server.url, "big.pt")
        bare = http.client.HTTPConnection("127.0.0.1", server.port)
        expected = float(np.memmap(bench.big, dtype="<f4", mode="r", offset=offset, shape=(length // 4,)).sum())
        for run_i in range(self.runs):
            bench_log(f"remote (nginx as S3), run {run_i + 1}/{self.runs}")
            for key, label in (("many.pt", "many"), ("big.pt", "big")):
                m, requests = self.mount(server, key, f"remote-{label}")
                self.add(f"mount_{label}_s", m.ready_s, "s")
                self.add(f"mount_{label}_requests", requests, "requests")
                bench.mounts.stop(m)
            m, _ = self.mount(server, "big.pt", "remote-seq")
            path = tensor_file(m.mnt, length)
            started = time.perf_counter()
            subprocess.run(["cat", path], stdout=subprocess.DEVNULL, check=True)
            self.add("seq_ckptfs", gb / (time.perf_counter() - started), "GB/s")
            bench.mounts.stop(m)
            for name, read in readers.items():
                started = time.perf_counter()
                got = read(offset, length)
                elapsed = time.perf_counter() - started
                if got != length:
                    raise RuntimeError(f"{name} read {got} of {length} bytes")
                self.add(f"seq_{name}", gb / elapsed, "GB/s")
                gc.collect()
            m, _ = self.mount(server, "big.pt", "remote-memmap")
            path = tensor_file(m.mnt, length)
            started = time.perf_counter()
            total = float(np.memmap(path, dtype="<f4", mode="r", shape=(length // 4,)).sum())
            self.add("memmap_ckptfs", gb / (time.perf_counter() - started), "GB/s")
            if total != expected:
                raise RuntimeError(f"memmap sum through the remote mount {total} != {expected} (the file's)")
            gc.collect()
            bench.mounts.stop(m)
            m, _ = self.mount(server, "big.pt", "remote-rand")
            through, direct = self.random_reads(tensor_file(m.mnt, length), bare, offset, length, run_i)
            self.add("rand_ckptfs_us", through, "us")
            self.add("rand_bare_us", direct, "us")
            bench.mounts.stop(m)
        bare.close()

    def random_reads(self, path: str, bare: http.client.HTTPConnection, base: int, length: int,
                     seed: int) -> tuple[float, float]:
        """Median µs of a 4 KiB pread through the mount and of a bare ranged GET, at the same offsets."""
        rng = random.Random(seed)
        fd = os.open(path, os.O_RDONLY)
        try:
            os.pread(fd, 4096, 0)  # the storage's framing is checked on its first read: not what is timed
            through, direct = [], []
            for _ in range(RANDOM_READS):
                at = rng.randrange(4096, length - 4096) // 4096 * 4096
                started = time.perf_counter()
                os.pread(fd, 4096, at)
                through.append(time.perf_counter() - started)
                started = time.perf_counter()
                bare.request("GET", f"/{BUCKET}/big.pt", headers={"Range": f"bytes={base + at}-{base + at + 4095}"})
                bare.getresponse().read()
                direct.append(time.perf_counter() - started)
        finally:
            os.close(fd)
        return statistics.median(through) * 1e6, statistics.median(direct) * 1e6

    def table(self) -> str:
        big, many = f"{self.bench.big_len / MiB:.0f} MiB", f"{self.bench.n_many}-tensor"
        labels = {
            "mount_big_requests": f"mount {big} checkpoint: GETs", "mount_big_s": f"mount {big} checkpoint",
            "mount_many_requests": f"mount {many} checkpoint: GETs", "mount_many_s": f"mount {many} checkpoint",
            "seq_ckptfs": "first read of the tensor: cat through the mount",
            "seq_boto3": "  boto3, one ranged GET", "seq_obstore": "  obstore get_range",
            "seq_s3tc_sequential": "  s3torchconnector sequential reader",
            "seq_s3tc_range": "  s3torchconnector range-based reader",
            "memmap_ckptfs": "np.memmap(...).sum() through the mount",
            "rand_ckptfs_us": "random 4 KiB pread through the mount (median)",
            "rand_bare_us": "  a bare ranged GET of 4 KiB (median)",
        }
        rows = [("figure (nginx as S3 on loopback)", "median", "runs")]
        for key, label in labels.items():
            value = self.median(key)
            if value is not None:
                rows.append((label, show(value, self.units[key]), " ".join(show(v, self.units[key], False)
                                                                            for v in self.figures[key])))
        clients = [c for c in CLIENTS if self.median(f"seq_{c}") is not None]
        best = max((self.median(f"seq_{c}") or 0.0 for c in clients), default=0.0)
        s3tc = max((self.median(f"seq_{c}") or 0.0 for c in clients if c.startswith("s3tc")), default=0.0)
        seq = self.median("seq_ckptfs") or 0.0
        checks = [
            (f"mount GETs, {big} / {many}", f"{self.median('mount_big_requests'):.0f} / "
             f"{self.median('mount_many_requests'):.0f}", "<= 2",
             max(self.median("mount_big_requests") or 0, self.median("mount_many_requests") or 0) <= 2),
            ("sequential / best single-stream client", ratio(seq, best), ">= 0.8x", best and seq / best >= 0.8),
            ("sequential / s3torchconnector (better reader)", ratio(seq, s3tc), ">= 1x", s3tc and seq / s3tc >= 1),
            ("memmap sum / sequential cat", ratio(self.median("memmap_ckptfs") or 0, seq), ">= 0.7x",
             seq and (self.median("memmap_ckptfs") or 0) / seq >= 0.7),
            ("random 4 KiB / bare GET", ratio(self.median("rand_ckptfs_us") or 0, self.median("rand_bare_us") or 0),
             "<= 1.5x", (self.median("rand_ckptfs_us") or 0) <= 1.5 * (self.median("rand_bare_us") or 0)),
        ]
        lines = render(rows)
        lines.append("")
        lines += render([("check (issue 13)", "value", "target", "met")] +
                        [(a, b, c, "yes" if d else "NO") for a, b, c, d in checks])
        return "\n".join(lines)


def tensor_file(mnt: str, length: int) -> str:
    """The mount's file of ``length`` bytes (the big tensor)."""
    for directory, _dirs, files in os.walk(mnt):
        for name in files:
            path = os.path.join(directory, name)
            if os.path.getsize(path) == length:
                return path
    raise RuntimeError(f"no file of {length} bytes under {mnt}")


def show(value: float, unit: str, with_unit: bool = True) -> str:
    text = {"GB/s": f"{value:.2f}", "s": f"{value * 1000:.0f}", "us": f"{value:.0f}",
            "requests": f"{value:.0f}"}[unit]
    return f"{text} {dict(s='ms').get(unit, unit)}" if with_unit else text


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def render(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def bench_log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run(bench: Bench) -> str:
    """Measures the remote section; its table."""
    return RemoteBench(bench).run()
