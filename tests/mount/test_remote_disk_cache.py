"""Mounts of an http:// checkpoint sharing a --cache-dir: the second one reads from disk, not the network."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from remote_servers import Nginx, nginx  # noqa: F401  (fixture)

from ckptfs.cli.main import build_parser
from ckptfs.cli.remote_options import remote_options
from ckptfs.sources.remote.options import DEFAULT_DISK_CACHE_SIZE, DiskCacheSetting
from mount.helpers import Mounter, run_cli


def test_a_second_mount_reads_the_blocks_the_first_cached(nginx: Nginx, mounter: Mounter,  # noqa: F811
                                                          tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(5)
    tensors = {"w": torch.randn(3 << 20, generator=generator), "b": torch.randn(100, generator=generator)}
    torch.save(tensors, nginx.root / "mount-cached.pt")
    url = f"{nginx.url}/mount-cached.pt"
    cache = tmp_path / "cache"
    first = mounter(url, "--cache-dir", str(cache))  # type: ignore[arg-type]
    assert (first / "w").read_bytes() == tensors["w"].numpy().tobytes()
    second = mounter(url, "--cache-dir", str(cache))  # type: ignore[arg-type]
    mounted = nginx.mark()
    assert (second / "w").read_bytes() == tensors["w"].numpy().tobytes()
    assert nginx.since(mounted) == []
    assert any((cache / "blocks").iterdir())


def test_remote_blocks_are_cached_on_disk_only_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    parser = build_parser()

    def setting(*options: str) -> DiskCacheSetting | None:
        return remote_options(parser.parse_args(["mount", "http://h/x.pt", "/mnt", *options])).disk_cache

    assert setting() is None and setting("--no-cache", "--disk-cache-size", "1GiB") is None
    assert setting("--cache-dir", str(tmp_path)) == DiskCacheSetting(tmp_path, DEFAULT_DISK_CACHE_SIZE)
    assert setting("--disk-cache-size", "2GiB") == DiskCacheSetting(tmp_path / "xdg" / "ckptfs", 2 << 30)
    result = run_cli("ls", "http://127.0.0.1:1/x.pt", "--disk-cache-size", "1KiB")
    assert result.returncode == 2 and "--disk-cache-size: at least 1MiB" in result.stderr
