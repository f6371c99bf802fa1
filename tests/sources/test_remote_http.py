"""http(s):// sources against a real nginx: requests counted in its access log, bytes compared with torch's."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest
import torch
from remote_servers import Nginx, timed_gets

import ckptfs
from ckptfs.errors import ObjectChangedError, SourceError
from ckptfs.sources import RemoteOptions, open_source
from ckptfs.sources.remote.cache import BLOCK, FIRST_WINDOW, MAX_WINDOW
from ckptfs.sources.remote.source import PART

MiB = 1 << 20
TAIL = "bytes=-2097152"


def checkpoint(nginx: Nginx, name: str, big_elements: int) -> dict[str, torch.Tensor]:
    """A state dict with a few small tensors and one of ``big_elements`` float32, saved under nginx's root."""
    generator = torch.Generator().manual_seed(big_elements)
    tensors = {f"layer{i}.weight": torch.randn(16, 8, generator=generator) for i in range(4)}
    tensors["big"] = torch.randn(big_elements, generator=generator)
    tensors["after"] = torch.randn(big_elements, generator=generator)
    path = nginx.root / name
    if not path.exists():
        torch.save(tensors, path)
    return tensors


def test_opening_is_one_suffix_get_whose_bytes_serve_the_zip_end(nginx: Nginx) -> None:
    checkpoint(nginx, "small.pt", 1000)
    mark = nginx.mark()
    source = open_source(f"{nginx.url}/small.pt")
    assert source.size == os.path.getsize(nginx.root / "small.pt")
    assert source.stat().mtime_ns == int(os.path.getmtime(nginx.root / "small.pt")) * 10**9
    assert source.stat().mode & 0o777 == 0o444
    requests = nginx.since(mark)
    assert [(r.range, r.status, r.sent) for r in requests] == [(TAIL, 206, source.size)]
    with ckptfs.open(source) as ck:
        assert ck.read(ck.tensors[0]) == torch.load(nginx.root / "small.pt")["layer0.weight"].numpy().tobytes()
    assert len(nginx.since(mark)) == 1  # the whole file came with the suffix GET


def test_requests_to_open_do_not_grow_with_the_data(nginx: Nginx) -> None:
    opened = {}
    for name, elements in (("data-1MiB.pt", 1 << 18), ("data-64MiB.pt", 1 << 24)):
        checkpoint(nginx, name, elements)
        mark = nginx.mark()
        with ckptfs.open(f"{nginx.url}/{name}") as ck:
            assert len(ck.tensors) == 6
        requests = nginx.since(mark)
        assert all(r.status == 206 and r.range.startswith("bytes=") for r in requests), requests
        assert requests[0].range == TAIL
        opened[name] = (len(requests), sum(r.sent for r in requests))
    assert opened["data-1MiB.pt"][0] == opened["data-64MiB.pt"][0] <= 3, opened
    assert opened["data-64MiB.pt"][1] <= 2 * MiB + 2 * BLOCK + MAX_WINDOW, opened


def test_a_tensor_read_alone_fetches_its_bytes_and_at_most_16_MiB_more(nginx: Nginx) -> None:
    tensors = checkpoint(nginx, "data-64MiB.pt", 1 << 24)
    with ckptfs.open(f"{nginx.url}/data-64MiB.pt") as ck:
        timed_gets(ck.source, 0.0001)  # a fast connection (a slow one's window: test_remote_parts)
        big = ck.tensor(("big",))
        mark = nginx.mark()
        step = 128 << 10
        data = b"".join(ck.read(big, at, min(step, big.nbytes - at)) for at in range(0, big.nbytes, step))
        assert data == tensors["big"].numpy().tobytes()
        requests = nginx.since(mark)
    assert all(r.status == 206 and r.if_match for r in requests)
    assert sum(r.sent for r in requests) <= big.nbytes + 16 * MiB + 2 * BLOCK  # and "after" lies beyond
    sizes = [r.sent for r in requests]
    assert len(requests) <= 32, sizes  # page-sized reads became a stream of growing GETs (each half a window or more)
    assert sizes[0] <= FIRST_WINDOW + step + 2 * BLOCK and max(sizes) <= PART + BLOCK, sizes  # small first, then growing to parts


def test_random_small_reads_cost_one_block_each_and_hit_the_cache_after(nginx: Nginx) -> None:
    checkpoint(nginx, "data-64MiB.pt", 1 << 24)
    raw = (nginx.root / "data-64MiB.pt").read_bytes()
    source = open_source(f"{nginx.url}/data-64MiB.pt")
    rng = random.Random(7)
    offsets = rng.sample(range(0, 60 * MiB, 3 * MiB), 20)  # apart: no stream continues
    mark = nginx.mark()
    for offset in offsets:
        assert source.read(offset + 100, 4096) == raw[offset + 100 : offset + 4196]
    first = nginx.since(mark, at_least=len(offsets))
    for offset in offsets:
        assert source.read(offset + 100, 4096) == raw[offset + 100 : offset + 4196]
    assert nginx.since(mark) == first
    assert all(r.sent <= BLOCK for r in first) and len(first) == len(offsets)


def test_the_cache_is_bounded_and_large_reads_go_in_parts(nginx: Nginx) -> None:
    checkpoint(nginx, "data-64MiB.pt", 1 << 24)
    raw = (nginx.root / "data-64MiB.pt").read_bytes()
    source = open_source(f"{nginx.url}/data-64MiB.pt", RemoteOptions(cache_size=32 * MiB))
    mark = nginx.mark()
    assert source.read(0, 40 * MiB) == raw[: 40 * MiB]  # more than a quarter of the cache: straight, in parts
    parts = nginx.since(mark)
    assert sorted(r.range for r in parts) == sorted(f"bytes={a}-{a + 8 * MiB - 1}" for a in range(0, 40 * MiB, 8 * MiB))
    for at in range(0, 60 * MiB, 1 * MiB):
        assert source.read(at, 1 * MiB) == raw[at : at + 1 * MiB]
    assert source._cache._bytes <= 32 * MiB  # noqa: SLF001
    mark = nginx.mark()
    assert source.read(0, 4096) == raw[:4096]
    assert [r.range for r in nginx.since(mark) if r.range.startswith("bytes=0-")] == [f"bytes=0-{BLOCK - 1}"]  # evicted


def test_a_replaced_object_is_an_error_not_mixed_bytes(nginx: Nginx) -> None:
    path = nginx.root / "replaced.pt"
    path.write_bytes(os.urandom(6 * MiB))
    source = open_source(f"{nginx.url}/replaced.pt")
    first = source.read(0, 100)
    assert first == path.read_bytes()[:100]
    path.write_bytes(os.urandom(6 * MiB))
    os.utime(path, (time.time() + 10, time.time() + 10))  # nginx's ETag is mtime and size
    with pytest.raises(ObjectChangedError, match=r"replaced\.pt: the object was replaced since it was opened"):
        source.read(1 * MiB, 100)
    assert source.read(0, 100) == first  # what was read before is still that version's


def test_errors_name_the_url_without_its_credentials(nginx: Nginx) -> None:
    with pytest.raises(SourceError, match=rf"^http://127\.0\.0\.1:{nginx.port}/missing\.pt: HTTP 404 Not Found$"):
        open_source(f"http://user:hunter2@127.0.0.1:{nginx.port}/missing.pt?X-Amz-Signature=secret")
    checkpoint(nginx, "small.pt", 1000)
    with ckptfs.open(f"http://user:hunter2@127.0.0.1:{nginx.port}/small.pt?X-Amz-Signature=secret") as ck:
        assert ck.path == f"{nginx.url}/small.pt"
    with pytest.raises(SourceError, match=r"^http://127\.0\.0\.1:1/m\.pt: .*refused.* \(gave up after 2 attempts\)$"):
        open_source("http://127.0.0.1:1/m.pt", RemoteOptions(storage_options={"retries": "2"}))
    with pytest.raises(SourceError, match=r"storage options region are not ones an http:// source takes"):
        open_source(f"{nginx.url}/small.pt", RemoteOptions(storage_options={"region": "x"}))


def test_reopen_after_fork_gives_the_child_its_own_connections(nginx: Nginx) -> None:
    checkpoint(nginx, "data-64MiB.pt", 1 << 24)
    raw = (nginx.root / "data-64MiB.pt").read_bytes()
    source = open_source(f"{nginx.url}/data-64MiB.pt", RemoteOptions(cache_size=32 * MiB))
    assert source.read(0, 10) == raw[:10]
    assert source.read(MiB, 20 * MiB) == raw[MiB : 21 * MiB]  # the parent's worker threads and connections
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            source.reopen()
            ok = source.read(3 * MiB, 20 * MiB) == raw[3 * MiB : 23 * MiB]
            os.write(write_end, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write_end)
    assert os.read(read_end, 1) == b"1"
    os.waitpid(pid, 0)
    assert source.read(50, 10) == raw[50:60]


def test_ls_and_info_of_a_url_equal_those_of_the_file(nginx: Nginx, tmp_path: Path) -> None:
    from mount.helpers import run_cli

    checkpoint(nginx, "data-1MiB.pt", 1 << 18)
    local = nginx.root / "data-1MiB.pt"
    url = f"{nginx.url}/data-1MiB.pt"
    assert run_cli("ls", "--json", url).stdout == run_cli("ls", "--json", local).stdout
    remote, disk = run_cli("info", "--json", url), run_cli("info", "--json", local)
    assert remote.returncode == 0 and remote.stdout.replace(url, "F") == disk.stdout.replace(str(local), "F")
    for target in (f"{nginx.url}/nothing.pt", "http://127.0.0.1:1/m.pt"):
        result = run_cli("ls", target, "--storage-option", "retries=2")
        assert result.returncode == 1 and result.stdout == "" and len(result.stderr.splitlines()) == 1, result.stderr
        assert result.stderr.startswith(f"ckptfs: {target}: ")


def test_https_with_the_certificate_trusted_and_refused_without(nginx: Nginx, monkeypatch: pytest.MonkeyPatch) -> None:
    tensors = checkpoint(nginx, "data-1MiB.pt", 1 << 18)
    with pytest.raises(SourceError, match=r"^https://127\.0\.0\.1:\d+/data-1MiB\.pt: TLS: self.signed certificate$"):
        open_source(f"{nginx.tls_url}/data-1MiB.pt")  # at once: no retry meets another certificate
    monkeypatch.setenv("SSL_CERT_FILE", str(nginx.certificate))
    with ckptfs.open(f"{nginx.tls_url}/data-1MiB.pt") as ck:
        assert ck.read(ck.tensor(("big",))) == tensors["big"].numpy().tobytes()
