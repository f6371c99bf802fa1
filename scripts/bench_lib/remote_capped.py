"""The remote section's per-connection-capped rows: nginx capping each answer at 40 MB/s (``limit_rate 40m``, as
object stores cap each connection) serving the 1 GiB checkpoint as S3.

Each run, in turn: ``dd bs=1M`` of the 1 GiB tensor through a fresh ckptfs mount; obstore fetching the same bytes
in 16 parallel parts of 8 MiB (``get_range_async``, 16 at once: ``get_ranges`` would merge adjacent ranges into
one GET); obstore fetching them in one stream (``get_range``); ``dd bs=1M`` of the local file through a ckptfs
mount, the FUSE path's own ceiling. Medians of the alternating runs; issue 25's targets. Also the obstore
parallel reader for the uncapped servers' table (``parallel_reader``).
"""
from __future__ import annotations

import asyncio
import os
import subprocess
import time
from typing import TYPE_CHECKING, Any, Callable

from remote import RemoteBench, bench_log, ratio, render, show, tensor_file
from remote_stores import BUCKET

if TYPE_CHECKING:
    from remote_stores import NginxStore

MiB = 1 << 20
PART = 8 * MiB
PARALLEL = 16


def obstore_store(store: Any) -> Any:
    from obstore.store import S3Store

    access, secret = store.env["AWS_ACCESS_KEY_ID"], store.env["AWS_SECRET_ACCESS_KEY"]
    signing: dict[str, Any] = ({"access_key_id": access, "secret_access_key": secret} if store.signed
                               else {"skip_signature": True})
    return S3Store(BUCKET, endpoint=store.url, virtual_hosted_style_request=False, region="us-east-1",
                   client_options={"allow_http": True}, **signing)


def parallel_reader(s3store: Any, key: str) -> Callable[[int, int], int]:
    """read(offset, length): the bytes in PART-sized GETs, PARALLEL at once; the bytes read."""
    import obstore

    async def fetch(offset: int, length: int) -> int:
        limit = asyncio.Semaphore(PARALLEL)

        async def part(at: int) -> int:
            async with limit:
                got = await obstore.get_range_async(s3store, key, start=at, end=min(at + PART, offset + length))
                return len(got)

        return sum(await asyncio.gather(*(part(at) for at in range(offset, offset + length, PART))))

    return lambda offset, length: asyncio.run(fetch(offset, length))


def dd(path: str) -> float:
    """Seconds of ``dd bs=1M`` of ``path`` to /dev/null."""
    started = time.perf_counter()
    subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=1M"], check=True, capture_output=True)
    return time.perf_counter() - started


def measure(rb: RemoteBench, store: NginxStore) -> None:
    import obstore

    bench = rb.bench
    assert bench.mounts is not None
    offset, length = bench.big_off, bench.big_len
    gb = length / 1e9
    s3store = obstore_store(store)
    parallel = parallel_reader(s3store, "big.pt")
    tag = store.name
    for run_i in range(rb.runs):
        bench_log(f"remote ({tag}), run {run_i + 1}/{rb.runs}")
        m, _ = rb.mount(store, "big.pt", "remote-capped")
        rb.add(f"{tag}:dd_ckptfs", gb / dd(tensor_file(m.mnt, length)), "GB/s")
        bench.mounts.stop(m)
        started = time.perf_counter()
        got = parallel(offset, length)
        rb.add(f"{tag}:obstore_parallel", gb / (time.perf_counter() - started), "GB/s")
        started = time.perf_counter()
        got2 = len(obstore.get_range(s3store, "big.pt", start=offset, end=offset + length))
        rb.add(f"{tag}:obstore_single", gb / (time.perf_counter() - started), "GB/s")
        if (got, got2) != (length, length):
            raise RuntimeError(f"obstore read {got} and {got2} of {length} bytes")
        rb.add(f"{tag}:dd_local_fuse", rb.local_read(dd), "GB/s")


def table(rb: RemoteBench, tag: str) -> str:
    big = f"{rb.bench.big_len / MiB:.0f} MiB"
    labels = {
        "dd_ckptfs": f"per-connection cap 40 MB/s: dd bs=1M of a {big} tensor through the mount",
        "obstore_parallel": f"  obstore, {PARALLEL} parallel {PART // MiB} MiB parts",
        "obstore_single": "  obstore, one stream (get_range)",
        "dd_local_fuse": "  dd bs=1M through a mount of the local file (the FUSE path's limit)",
    }
    rows = [(f"figure ({tag}: nginx limit_rate 40m, as S3 on loopback)", "median", "runs")]
    for key, label in labels.items():
        values = rb.figures.get(f"{tag}:{key}")
        if values:
            unit = rb.units[f"{tag}:{key}"]
            rows.append((label, show(rb.median(f"{tag}:{key}") or 0.0, unit),
                         " ".join(show(v, unit, False) for v in values)))

    def med(key: str) -> float:
        return rb.median(f"{tag}:{key}") or 0.0

    mount, par, single, limit = med("dd_ckptfs"), med("obstore_parallel"), med("obstore_single"), med("dd_local_fuse")
    target = 0.9 if not limit or limit >= 0.9 * par else 0.9 * limit / par
    checks = [
        ("mount / obstore parallel parts", ratio(mount, par), f">= {target:.2f}x", par and mount / par >= target),
        ("  limit: local-file dd through FUSE / obstore parallel", ratio(limit, par), "(bound)", None),
        ("mount / one stream", ratio(mount, single), ">= 4x", single and mount / single >= 4),
    ]
    lines = render(rows)
    lines.append("")
    lines += render([(f"check (issue 25, {tag})", "value", "target", "met")] +
                    [(a, b, c, "-" if d is None else "yes" if d else "NO") for a, b, c, d in checks])
    lines.append(f"(other processes share the machine's {os.cpu_count()} cores)")
    return "\n".join(lines)
