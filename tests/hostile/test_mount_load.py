"""16 concurrent readers (8 threads, 8 processes) read every tensor of a 2,000-tensor checkpoint, 100,000 reads.

Random tensors, offsets and sizes (1 B to 256 KiB); every byte is checked against torch's own. The
page cache is dropped every half second so that reads keep reaching the daemon, whose RSS is sampled
throughout. The throughput is printed (``pytest -s``) and recorded as a test property.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from hostile.conftest import Runner
from hostile.load_reader import read_randomly
from hostile.mounting import Mounts, daemon_serving

TENSORS = 2000
THREADS = 8
PROCESSES = 8
READS = 100_000
RSS_BOUND = 500 << 20
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int8, torch.uint8, torch.float64)


def _checkpoint(directory: Path) -> tuple[Path, Path, Path]:
    """The checkpoint, the expected bytes of every tensor back to back, and an index of where each one is."""
    gen = torch.Generator().manual_seed(3)
    state: dict[str, torch.Tensor] = {}
    for k in range(TENSORS):
        dtype = DTYPES[k % len(DTYPES)]
        rows, cols = int(torch.randint(1, 96, (1,), generator=gen)), int(torch.randint(1, 96, (1,), generator=gen))
        base = torch.randint(0, 120, (rows, cols), generator=gen).to(dtype)
        state[f"layer{k // 10}.p{k % 10}"] = base.t() if k % 9 == 0 else base  # every ninth one is strided
    source = directory / "load.pt"
    torch.save(state, source)
    expected, index, position = bytearray(), [], 0
    for name, tensor in state.items():
        flat = tensor.contiguous().view(-1)
        raw = (flat.view(torch.int16) if tensor.dtype == torch.bfloat16 else flat).numpy().tobytes()
        index.append({"file": name, "start": position, "nbytes": len(raw)})
        expected += raw
        position += len(raw)
    (directory / "expected.bin").write_bytes(expected)
    (directory / "index.json").write_text(json.dumps(index))
    return source, directory / "expected.bin", directory / "index.json"


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


@pytest.mark.parametrize("mode", ["default", "multithreaded"])
def test_load(mode: str, runner: Runner, mounts: Mounts, tmp_path: Path, record_property) -> None:
    source, expected_path, index_path = _checkpoint(tmp_path)
    expected = expected_path.read_bytes()
    index = json.loads(index_path.read_text())
    mnt = mounts.directory()
    # No address-space limit here: each libfuse worker thread reserves stack and a malloc arena, virtual
    # memory that RLIMIT_AS counts; the daemon's real footprint, its RSS, is sampled instead.
    result = runner.run("mount", *(["--multithreaded"] if mode == "multithreaded" else []), source, mnt, memory=0)
    assert result.rc == 0, result.stderr
    daemon = daemon_serving(source)
    mounts.daemons.add(daemon)
    per_reader = READS // (THREADS + PROCESSES)
    rss: list[int] = [_rss(daemon)]
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.5):
            rss.append(_rss(daemon))
            with contextlib.suppress(OSError):  # root only: elsewhere the page cache answers more reads
                Path("/proc/sys/vm/drop_caches").write_text("1")

    results: list[dict] = []
    start = time.monotonic()
    processes = [subprocess.Popen([sys.executable, str(Path(__file__).with_name("load_reader.py")), str(mnt),
                                   str(expected_path), str(index_path), str(1000 + n), str(per_reader)],
                                  stdout=subprocess.PIPE, text=True) for n in range(PROCESSES)]
    threads = [threading.Thread(target=lambda n=n: results.append(read_randomly(mnt, expected, index, n,
                                                                                per_reader)))
               for n in range(THREADS)]
    watcher = threading.Thread(target=watch)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for proc in processes:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0
        results.append(json.loads(out))
    elapsed = time.monotonic() - start
    done.set()
    watcher.join()
    rss.append(_rss(daemon))

    reads = sum(r["reads"] for r in results)
    total = sum(r["bytes"] for r in results)
    summary = {"mode": mode, "readers": len(results), "reads": reads, "bytes": total,
               "wrong": sum(r["wrong"] for r in results), "errors": sum(r["errors"] for r in results),
               "seconds": round(elapsed, 2), "reads_per_s": round(reads / elapsed), "mib_per_s": round(total / elapsed / 2**20, 1),
               "daemon_rss_mib": [round(min(rss) / 2**20), round(max(rss) / 2**20)]}
    print(f"\nload: {json.dumps(summary)}")
    record_property("load", summary)
    assert len(results) == THREADS + PROCESSES and reads >= READS
    assert all(r["tensors"] == TENSORS for r in results)
    assert summary["wrong"] == 0 and summary["errors"] == 0, [r["error_samples"] for r in results]
    assert max(rss) < RSS_BOUND
