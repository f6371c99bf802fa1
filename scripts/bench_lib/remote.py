"""``scripts/bench --sections remote`` (or ``--remote``): ckptfs mounts of s3:// URLs against S3 clients reading
the same bytes, over nginx (a path-style S3 stand-in) and Ceph's radosgw on 127.0.0.1 (``remote_stores.py``).

For each server: ``ckptfs mount`` of the 1 GiB and the 20,000-tensor checkpoints (requests, seconds); the first
sequential read (``cat``) of the 1 GiB tensor through a fresh mount against one ranged GET of the same bytes by
boto3, obstore's ``get_range`` and 16 parallel 8 MiB parts, and s3torchconnector's sequential and range-based readers (``force_path_style``);
ckptfs's remote reader alone in process (``remote_reader.py``: what the reader does without FUSE);
``np.memmap(...).sum()`` through a fresh mount; random 4 KiB ``pread``s through a mount against bare keep-alive
ranged GETs (``http.client``). Once a run, the same ``cat`` through a mount of the local file: the FUSE path's
own limit, which bounds a remote mount's. ``dd bs=1M`` through a fresh mount too, and the daemon's CPU time
(user and system, all its threads) during it, per GiB (issue 25's rows). Ratios against
issue 13's targets. Then the same over nginx capping each connection at 40 MB/s (``remote_capped.py``). The clients are bench-only:
``scripts/bench`` installs them when the section is asked for.
"""
from __future__ import annotations

import gc
import http.client
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Union

import numpy as np
from common import proc_stat
from remote_stores import BUCKET, CappedNginxStore, NginxStore, RadosgwStore, missing_radosgw

if TYPE_CHECKING:
    from harness import Bench

MiB = 1 << 20
RANDOM_READS = 300
CLIENTS = ("boto3", "obstore", "obstore_parallel", "s3tc_sequential", "s3tc_range")
Store = Union[NginxStore, RadosgwStore]


def ensure_clients() -> list[str]:
    """The clients importable here (``scripts/bench`` pip-installs them for the remote section)."""
    present = []
    for module, names in (("boto3", ["boto3"]), ("obstore", ["obstore"]),
                          ("s3torchconnector", ["s3tc_sequential", "s3tc_range"])):
        try:
            __import__(module)
            present += names
        except ImportError:
            pass
    return present


def client_readers(store: Store, key: str) -> dict[str, Callable[[int, int], int]]:
    """name -> read(offset, length) giving the bytes read, one client each, made once (its connections warm)."""
    os.environ.update(store.env)  # s3torchconnector's client takes its credentials from the environment
    access, secret = store.env["AWS_ACCESS_KEY_ID"], store.env["AWS_SECRET_ACCESS_KEY"]
    url = store.url
    readers: dict[str, Callable[[int, int], int]] = {}
    present = ensure_clients()
    if "boto3" in present:
        import boto3
        from botocore import UNSIGNED
        from botocore.config import Config

        config = Config(s3={"addressing_style": "path"}, **({} if store.signed else {"signature_version": UNSIGNED}))
        client = boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id=access,
                              aws_secret_access_key=secret, config=config)

        def boto(offset: int, length: int) -> int:
            body = client.get_object(Bucket=BUCKET, Key=key, Range=f"bytes={offset}-{offset + length - 1}")["Body"]
            return len(body.read())

        readers["boto3"] = boto
    if "obstore" in present:
        import obstore
        from obstore.store import S3Store

        signing: dict[str, Any] = ({"access_key_id": access, "secret_access_key": secret} if store.signed
                                   else {"skip_signature": True})
        s3store = S3Store(BUCKET, endpoint=url, virtual_hosted_style_request=False, region="us-east-1",
                          client_options={"allow_http": True}, **signing)
        readers["obstore"] = lambda offset, length: len(obstore.get_range(s3store, key, start=offset,
                                                                          end=offset + length))
        from remote_capped import parallel_reader

        readers["obstore_parallel"] = parallel_reader(s3store, key)
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

    def mount(self, store: Store, key: str, tag: str) -> tuple[Any, int | None]:
        """A fresh ckptfs mount of s3://bkt/KEY; the GETs it made (None where the server does not count them)."""
        bench = self.bench
        assert bench.mounts is not None
        mnt = str(bench.workdir / "mnt" / tag)
        argv, env = bench.ckptfs_argv(f"s3://{BUCKET}/{key}", mnt)
        argv += store.mount_args
        env.update(store.env)
        mark = store.mark()
        m = bench.mounts.start(tag, argv, mnt, env=env, daemon=bench.args.mount_mode == "daemon")
        return m, store.gets_since(mark, 1)

    def run(self) -> str:
        bench = self.bench
        stores: list[Callable[[Path], Store]] = [NginxStore, CappedNginxStore]
        if missing_radosgw():
            bench_log(f"radosgw is not measured: {', '.join(missing_radosgw())} missing "
                      "(apt-get install radosgw ceph-mon ceph-osd ceph-common)")
        else:
            stores.append(RadosgwStore)
        tables = []
        for make in stores:
            bench_log(f"remote: starting {make.name}")
            store = make(bench.workdir / f"remote-{make.name}")
            try:
                store.publish(bench.big, "big.pt")
                if isinstance(store, CappedNginxStore):
                    import remote_capped

                    remote_capped.measure(self, store)
                    tables.append(remote_capped.table(self, store.name))
                    continue
                store.publish(bench.many, "many.pt")
                self.measure(store)
            finally:
                store.close()
            tables.append(self.table(store.name))
        return "\n\n".join(tables)

    def measure(self, store: Store) -> None:
        bench = self.bench
        assert bench.mounts is not None
        offset, length = bench.big_off, bench.big_len
        gb = length / 1e9
        readers = client_readers(store, "big.pt")
        bare = http.client.HTTPConnection("127.0.0.1", int(store.url.rpartition(":")[2]))
        bare_target = store.bare_target("big.pt")
        expected = float(np.memmap(bench.big, dtype="<f4", mode="r", offset=offset, shape=(length // 4,)).sum())
        tag = store.name
        for run_i in range(self.runs):
            bench_log(f"remote ({tag}), run {run_i + 1}/{self.runs}")
            self.add(f"{tag}:seq_local_fuse", self.local_cat(), "GB/s")
            for key, label in (("many.pt", "many"), ("big.pt", "big")):
                m, requests = self.mount(store, key, f"remote-{label}")
                self.add(f"{tag}:mount_{label}_s", m.ready_s, "s")
                if requests is not None:
                    self.add(f"{tag}:mount_{label}_requests", requests, "requests")
                bench.mounts.stop(m)
            m, _ = self.mount(store, "big.pt", "remote-seq")
            path = tensor_file(m.mnt, length)
            started = time.perf_counter()
            subprocess.run(["cat", path], stdout=subprocess.DEVNULL, check=True)
            self.add(f"{tag}:seq_ckptfs", gb / (time.perf_counter() - started), "GB/s")
            bench.mounts.stop(m)
            m, _ = self.mount(store, "big.pt", "remote-dd")
            before = proc_stat(m.pid)
            started = time.perf_counter()
            subprocess.run(["dd", f"if={tensor_file(m.mnt, length)}", "of=/dev/null", "bs=1M"], check=True,
                           capture_output=True)
            self.add(f"{tag}:seq_dd", gb / (time.perf_counter() - started), "GB/s")
            after = proc_stat(m.pid)
            if before and after:  # the daemon's threads, user and system: its fetches and its replies
                self.add(f"{tag}:dd_cpu", (after.cpu_s - before.cpu_s) / (length / 2**30), "s/GiB")
            bench.mounts.stop(m)
            self.add(f"{tag}:seq_reader", self.reader_alone(store), "GB/s")
            for name, read in readers.items():
                started = time.perf_counter()
                got = read(offset, length)
                elapsed = time.perf_counter() - started
                if got != length:
                    raise RuntimeError(f"{name} read {got} of {length} bytes")
                self.add(f"{tag}:seq_{name}", gb / elapsed, "GB/s")
                gc.collect()
            m, _ = self.mount(store, "big.pt", "remote-memmap")
            path = tensor_file(m.mnt, length)
            started = time.perf_counter()
            total = float(np.memmap(path, dtype="<f4", mode="r", shape=(length // 4,)).sum())
            self.add(f"{tag}:memmap_ckptfs", gb / (time.perf_counter() - started), "GB/s")
            if total != expected:
                raise RuntimeError(f"memmap sum through the remote mount {total} != {expected} (the file's)")
            gc.collect()
            bench.mounts.stop(m)
            m, _ = self.mount(store, "big.pt", "remote-rand")
            through, direct = self.random_reads(tensor_file(m.mnt, length), bare, bare_target, offset, length,
                                                run_i)
            self.add(f"{tag}:rand_ckptfs_us", through, "us")
            self.add(f"{tag}:rand_bare_us", direct, "us")
            bench.mounts.stop(m)
        bare.close()

    def local_cat(self) -> float:
        """GB/s of ``cat`` of the big tensor through a fresh ckptfs mount of the local file (in page cache): the
        FUSE path's limit, measured beside the remote figures."""
        def cat(path: str) -> float:
            started = time.perf_counter()
            subprocess.run(["cat", path], stdout=subprocess.DEVNULL, check=True)
            return time.perf_counter() - started
        return self.local_read(cat)

    def local_read(self, read: Callable[[str], float]) -> float:
        """GB/s of ``read(path)`` (its seconds) of the big tensor's file in a fresh ckptfs mount of the local file,
        the source in the page cache."""
        bench = self.bench
        assert bench.mounts is not None
        mnt = str(bench.workdir / "mnt" / "remote-local")
        argv, env = bench.ckptfs_argv(str(bench.big), mnt)
        m = bench.mounts.start("remote-local", argv, mnt, env=env, daemon=bench.args.mount_mode == "daemon")
        try:
            path = tensor_file(m.mnt, bench.big_len)
            subprocess.run(["cat", str(bench.big)], stdout=subprocess.DEVNULL, check=True)  # the source in cache
            return bench.big_len / 1e9 / read(path)
        finally:
            bench.mounts.stop(m)

    def reader_alone(self, store: Store) -> float:
        """GB/s of ckptfs's remote reader in process, the ckptfs the mounts run (``remote_reader.py``)."""
        bench = self.bench
        _argv, env = bench.ckptfs_argv("-", "-")
        env.update(store.env)
        script = Path(__file__).with_name("remote_reader.py")
        argv = [sys.executable, "-P", str(script), f"s3://{BUCKET}/big.pt", str(bench.big_off), str(bench.big_len),
                *store.mount_args[1:]]
        out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True).stdout
        return float(out.split()[-1])

    def random_reads(self, path: str, bare: http.client.HTTPConnection, target: str, base: int, length: int,
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
                bare.request("GET", target, headers={"Range": f"bytes={base + at}-{base + at + 4095}"})
                response = bare.getresponse()
                if len(response.read()) != 4096 or response.status != 206:
                    raise RuntimeError(f"a bare ranged GET answered {response.status}")
                direct.append(time.perf_counter() - started)
        finally:
            os.close(fd)
        return statistics.median(through) * 1e6, statistics.median(direct) * 1e6

    def table(self, tag: str) -> str:
        big, many = f"{self.bench.big_len / MiB:.0f} MiB", f"{self.bench.n_many}-tensor"
        labels = {
            "mount_big_requests": f"mount {big} checkpoint: GETs", "mount_big_s": f"mount {big} checkpoint",
            "mount_many_requests": f"mount {many} checkpoint: GETs", "mount_many_s": f"mount {many} checkpoint",
            "seq_ckptfs": "first read of the tensor: cat through the mount",
            "seq_dd": "  dd bs=1M through the mount",
            "dd_cpu": "  daemon CPU (user + system) of that dd, per GiB",
            "seq_reader": "  ckptfs's remote reader alone, in process (1 MiB reads)",
            "seq_local_fuse": "  cat through a mount of the local file (the FUSE path's limit)",
            "seq_boto3": "  boto3, one ranged GET", "seq_obstore": "  obstore get_range",
            "seq_obstore_parallel": "  obstore, 16 parallel 8 MiB parts",
            "seq_s3tc_sequential": "  s3torchconnector sequential reader",
            "seq_s3tc_range": "  s3torchconnector range-based reader",
            "memmap_ckptfs": "np.memmap(...).sum() through the mount",
            "rand_ckptfs_us": "random 4 KiB pread through the mount (median)",
            "rand_bare_us": "  a bare ranged GET of 4 KiB (median)",
        }
        rows = [(f"figure ({tag} as S3 on loopback)", "median", "runs")]
        for key, label in labels.items():
            values = self.figures.get(f"{tag}:{key}")
            if values:
                unit = self.units[f"{tag}:{key}"]
                rows.append((label, show(statistics.median(values), unit),
                             " ".join(show(v, unit, False) for v in values)))

        def med(key: str) -> float:
            return self.median(f"{tag}:{key}") or 0.0

        clients = [c for c in CLIENTS if med(f"seq_{c}")]
        best = max((med(f"seq_{c}") for c in clients), default=0.0)
        s3tc = max((med(f"seq_{c}") for c in clients if c.startswith("s3tc")), default=0.0)
        seq, limit = med("seq_ckptfs"), med("seq_local_fuse")
        checks: list[tuple[str, str, str, Any]] = []
        if self.figures.get(f"{tag}:mount_big_requests"):
            checks.append((f"mount GETs, {big} / {many}", f"{med('mount_big_requests'):.0f} / "
                           f"{med('mount_many_requests'):.0f}", "<= 2",
                           max(med("mount_big_requests"), med("mount_many_requests")) <= 2))
        checks += [
            ("sequential / best client (obstore single or parallel too)", ratio(seq, best), ">= 0.8x",
             best and seq / best >= 0.8),
            ("  dd bs=1M / best client (issue 25)", ratio(med("seq_dd"), best), ">= 0.8x",
             best and med("seq_dd") / best >= 0.8),
            ("  limit: local-file cat through FUSE / best client", ratio(limit, best), "(bound)",
             best and limit / best >= 0.8),
            ("  sequential / that limit", ratio(seq, limit), "", None),
            ("  reader alone, no FUSE / best client", ratio(med("seq_reader"), best), "", None),
            ("sequential / s3torchconnector (better reader)", ratio(seq, s3tc), ">= 1x", s3tc and seq / s3tc >= 1),
            ("memmap sum / sequential cat", ratio(med("memmap_ckptfs"), seq), ">= 0.7x",
             seq and med("memmap_ckptfs") / seq >= 0.7),
            ("random 4 KiB / bare GET", ratio(med("rand_ckptfs_us"), med("rand_bare_us")), "<= 1.5x",
             med("rand_ckptfs_us") <= 1.5 * med("rand_bare_us")),
            ("daemon CPU per GiB of dd (issue 25)", show(med("dd_cpu"), "s/GiB"), "<= 0.35 s/GiB",
             med("dd_cpu") and med("dd_cpu") <= 0.35),
        ]
        lines = render(rows)
        lines.append("")
        lines += render([(f"check (issue 13, {tag})", "value", "target", "met")] +
                        [(a, b, c, "-" if d is None else "yes" if d else "NO") for a, b, c, d in checks])
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
    text = {"GB/s": f"{value:.2f}", "s": f"{value * 1000:.0f}", "us": f"{value:.0f}", "s/GiB": f"{value:.2f}",
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
