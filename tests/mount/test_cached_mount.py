"""A mount from the metadata cache serves what a mount of the parse serves: the index and every file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from many_tensors import save_many, small_zips_cached  # noqa: F401  (fixture)
from remote_servers import Nginx, nginx  # noqa: F401  (fixture)

import ckptfs.cache
from cache.helpers import entries, written_entries
from mount.helpers import Mounter, daemon_pids, run_cli, wait_until


def files(mnt: Path) -> dict[str, bytes]:
    found = {}
    for folder, _, names in os.walk(mnt):
        for name in names:
            path = Path(folder) / name
            found[str(path.relative_to(mnt))] = path.read_bytes()
    return found


@pytest.mark.usefixtures("small_zips_cached")
def test_a_mount_from_the_cache_serves_the_same_files(mounter: Mounter, tmp_path: Path) -> None:
    source = save_many(tmp_path / "many.pt", ckptfs.cache.MIN_TENSORS + 10)
    cache = tmp_path / "cache"
    parsed = files(mounter(source, "--no-cache"))
    assert not cache.exists()
    first = mounter(source, "--cache-dir", str(cache))
    (entry,) = written_entries(cache)  # written by a process of its own once mounted
    os.utime(entry, ns=(0, 0))
    again = mounter(source, "--cache-dir", str(cache))
    assert entry.stat().st_mtime_ns > 0  # read: a hit marks the entry used
    assert files(first) == parsed
    served = files(again)
    assert served == parsed
    assert ".ckptfs/index.json" in served and len(served) > 2 * ckptfs.cache.MIN_TENSORS


@pytest.mark.usefixtures("small_zips_cached")
def test_a_first_mount_writes_its_entry_from_a_process_of_its_own(mounter: Mounter, tmp_path: Path) -> None:
    """The entry is encoded (with numpy) by a process the command forks once mounted: the daemon holds none of it."""
    source = save_many(tmp_path / "many.pt", ckptfs.cache.MIN_TENSORS + 10)
    cache = tmp_path / "cache"
    mnt = mounter(source, "--cache-dir", str(cache))
    wait_until(lambda: len(entries(cache)) == 1 and len(daemon_pids(mnt)) == 1)  # the writer has its command line
    (daemon,) = daemon_pids(mnt)
    mapped = Path(f"/proc/{daemon}/maps").read_text()
    assert "libfuse3" in mapped and "numpy" not in mapped
    assert len(os.listdir(mnt)) > 2 * ckptfs.cache.MIN_TENSORS


def test_a_repeat_mount_of_a_url_is_one_get_and_serves_the_same_files(nginx: Nginx, mounter: Mounter,  # noqa: F811
                                                                     tmp_path: Path) -> None:
    save_many(nginx.root / "cached-mount.pt", ckptfs.cache.MIN_TENSORS + 10)
    url = f"{nginx.url}/cached-mount.pt"
    cache = tmp_path / "cache"
    parsed = files(mounter(url, "--no-cache"))
    mounter(url, "--cache-dir", str(cache))
    written_entries(cache)
    mark = nginx.mark()
    again = mounter(url, "--cache-dir", str(cache))
    ready = nginx.since(mark, at_least=1)
    assert [(r.range[:7], r.status) for r in ready] == [("bytes=-", 206)]  # the suffix GET: no data.pkl fetched
    assert files(again) == parsed


def test_ls_and_info_of_a_url_from_the_cache_equal_the_parse(nginx: Nginx, tmp_path: Path) -> None:  # noqa: F811
    save_many(nginx.root / "cached-cli.pt", ckptfs.cache.MIN_TENSORS + 10)
    url = f"{nginx.url}/cached-cli.pt"
    cache = str(tmp_path / "cache")
    for command in (["ls", "--json"], ["info", "--json"], ["ls"], ["info"]):
        parsed = run_cli(*command, url, "--no-cache")
        written = run_cli(*command, url, "--cache-dir", cache)
        written_entries(Path(cache))
        mark = nginx.mark()
        cached = run_cli(*command, url, "--cache-dir", cache)
        assert len(nginx.since(mark, at_least=1)) == 1
        assert parsed.returncode == written.returncode == cached.returncode == 0, cached.stderr
        assert parsed.stdout == written.stdout == cached.stdout and parsed.stdout


@pytest.mark.parametrize("spelled", ["--cache-dir ", "-o cache_dir="])
def test_an_unusable_cache_dir_is_one_warning_and_the_mount_goes_on(mounter: Mounter, tmp_path: Path,
                                                                    spelled: str) -> None:
    source = save_many(tmp_path / "many.pt", ckptfs.cache.MIN_TENSORS + 10)
    (tmp_path / "a-file").write_bytes(b"")
    mnt = mounter.directory()
    flag, _, prefix = spelled.partition(" ")
    result = run_cli("mount", source, mnt, flag.rstrip("="), f"{prefix}{tmp_path}/a-file")
    assert result.returncode == 0
    assert result.stderr.splitlines() == [f"ckptfs: warning: {spelled}{tmp_path}/a-file is unusable: cache "
                                          f"folder {tmp_path}/a-file/metadata: Not a directory; going on without "
                                          "the cache"]
    assert files(mnt) == files(mounter(source, "--no-cache"))


@pytest.mark.usefixtures("small_zips_cached")
def test_mount_takes_the_cache_folder_as_an_option_too(mounter: Mounter, tmp_path: Path) -> None:
    source = save_many(tmp_path / "many.pt", ckptfs.cache.MIN_TENSORS + 10)
    mounter(source, "-o", f"cache_dir={tmp_path}/cache")
    mounter(source, "-o", f"nocache,cache_dir={tmp_path}/unused")
    assert len(written_entries(tmp_path / "cache")) == 1
    assert not (tmp_path / "unused").exists()
