"""DCP directories on object storage: a URL prefix (http:// on nginx, s3:// on moto, memory:// through fsspec) reads
as the same directory on disk, its files opened lazily by their URLs, listed only for per-rank metadata."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from dcp_writers import raw_bytes, simulate_ranks, simulate_ranks_without_collectives, torch_view
from remote_servers import MotoS3, Nginx

import ckptfs
from ckptfs.errors import NoSuchObjectError, NotACheckpointError, SourceError
from ckptfs.sources import PrefixSet, RemoteOptions, open_source

SHARDED = {"model.wide": (0, 3), "model.cols": (1, 4)}


def sharded_state() -> dict[str, Any]:
    return {"model": {"wide": torch.arange(7 * 6, dtype=torch.float32).reshape(7, 6),
                      "cols": torch.arange(4 * 10, dtype=torch.int16).reshape(4, 10),
                      "bias": torch.ones(3)},
            "step": 5}


@pytest.fixture(scope="module")
def dcp_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("dcp-prefix")
    simulate_ranks(sharded_state(), SHARDED, base / "sim3", world=3)
    simulate_ranks_without_collectives(sharded_state(), SHARDED, base / "ranks", world=3)
    return {"sim3": base / "sim3", "ranks": base / "ranks"}


def tensor_bytes(ck: ckptfs.Checkpoint) -> dict[tuple[Any, ...], bytes]:
    return {t.path: ck.read(t) for t in ck}


def assert_torchs(ck: ckptfs.Checkpoint, theirs: dict[str, Any]) -> None:
    assert ck.format == "dcp"
    assert ck.read(ck.tensor(("model", "wide"))) == raw_bytes(theirs["model"]["wide"])
    assert ck.read(ck.tensor(("model", "cols"))) == raw_bytes(theirs["model"]["cols"])
    assert ck.read(ck.tensor(("model", "bias"))) == raw_bytes(theirs["model"]["bias"])
    assert ck.root["step"] == theirs["step"] == 5


def test_an_http_prefix_reads_as_the_directory_and_as_torch(nginx: Nginx, dcp_dirs: dict[str, Path],
                                                            tmp_path: Path) -> None:
    shutil.copytree(dcp_dirs["sim3"], nginx.root / "run" / "step10", dirs_exist_ok=True)
    theirs = torch_view(dcp_dirs["sim3"], tmp_path / "torch.pt")
    with ckptfs.open(dcp_dirs["sim3"]) as local:
        expected, details = tensor_bytes(local), local.details
    mark = nginx.mark()
    with ckptfs.open(f"{nginx.url}/run/step10/") as ck:
        assert isinstance(ck.source, PrefixSet) and ck.path == f"{nginx.url}/run/step10/"
        opening = nginx.since(mark)
        # .metadata, and the file holding the non-tensor item "step" (parsed on opening): one suffix GET each, of
        # tail_size for the metadata, of a cache block for a data file
        assert [(r.path, r.range, r.status) for r in opening] == [("/run/step10/.metadata", "bytes=-2097152", 206),
                                                                    ("/run/step10/__0_0.distcp", "bytes=-65536", 206)]
        assert ck.details == details
        wide = ck.tensor(("model", "wide"))
        files = {chunk.file for chunk in wide.chunks}
        mark = nginx.mark()
        assert ck.read(wide) == expected[("model", "wide")]
        reads = nginx.since(mark)
        # the files holding its chunks not opened yet, each whole in its suffix GET (small files)
        assert sorted(r.path.rpartition("/")[2] for r in reads) == sorted(files - {"__0_0.distcp"}), reads
        assert all(r.status == 206 and r.range == "bytes=-65536" for r in reads), reads
        assert tensor_bytes(ck) == expected
        assert_torchs(ck, theirs)
        assert ck.source.stat().mode & 0o777 == 0o555
    with ckptfs.open(f"{nginx.url}/run/step10") as ck:  # no trailing slash: no object there, a .metadata below
        assert isinstance(ck.source, PrefixSet) and tensor_bytes(ck) == expected


def test_http_prefixes_that_cannot_be_read_say_why(nginx: Nginx, dcp_dirs: dict[str, Path]) -> None:
    shutil.copytree(dcp_dirs["ranks"], nginx.root / "ranks", dirs_exist_ok=True)
    with pytest.raises(SourceError, match=r"^http://127\.0\.0\.1:\d+/ranks/: cannot list the objects below the "
                                          r"prefix: an http\(s\):// server has no listing.*use_collectives=False"):
        ckptfs.open(f"{nginx.url}/ranks/")
    with pytest.raises(NoSuchObjectError, match=r"^http://127\.0\.0\.1:\d+/nothing/here: HTTP 404 Not Found$"):
        ckptfs.open(f"{nginx.url}/nothing/here")


def test_a_missing_member_is_an_error_when_read(nginx: Nginx, dcp_dirs: dict[str, Path]) -> None:
    shutil.copytree(dcp_dirs["sim3"], nginx.root / "holed", dirs_exist_ok=True)
    with ckptfs.open(f"{nginx.url}/holed/") as ck:
        wide = ck.tensor(("model", "wide"))
        (nginx.root / "holed" / wide.chunks[-1].file).unlink()
        with pytest.raises(NoSuchObjectError, match=r"/holed/__\d_0\.distcp: HTTP 404 Not Found"):
            ck.read(wide)


def upload(s3: MotoS3, directory: Path, bucket: str, prefix: str) -> None:
    for file in directory.iterdir():
        s3.client.put_object(Bucket=bucket, Key=f"{prefix}{file.name}", Body=file.read_bytes())


def test_s3_prefixes_with_and_without_collectives(s3_env: MotoS3, dcp_dirs: dict[str, Path],
                                                   tmp_path: Path) -> None:
    s3_env.client.create_bucket(Bucket="dcp")
    upload(s3_env, dcp_dirs["sim3"], "dcp", "run 1/step10/")
    upload(s3_env, dcp_dirs["ranks"], "dcp", "run 1/ranks/")
    s3_env.client.put_object(Bucket="dcp", Key="run 1/ranks/sub/ignored.txt", Body=b"not a member")
    theirs = torch_view(dcp_dirs["sim3"], tmp_path / "torch.pt")
    for local, url in ((dcp_dirs["sim3"], "s3://dcp/run 1/step10/"), (dcp_dirs["sim3"], "s3://dcp/run 1/step10"),
                       (dcp_dirs["ranks"], "s3://dcp/run 1/ranks/"), (dcp_dirs["ranks"], "s3://dcp/run 1/ranks")):
        with ckptfs.open(local) as ck:
            expected, details = tensor_bytes(ck), ck.details
        with ckptfs.open(url) as ck:
            assert ck.path == url.rstrip("/") + "/"
            assert (tensor_bytes(ck), ck.details) == (expected, details)
            assert_torchs(ck, theirs)
    listed = open_source("s3://dcp/run 1/ranks/")
    assert isinstance(listed, PrefixSet)
    assert listed.names() == {p.name: p.stat().st_size for p in sorted(dcp_dirs["ranks"].iterdir())}
    with pytest.raises(NotACheckpointError, match=r"^s3://dcp/nothing/: a directory, but no checkpoint directory: "):
        ckptfs.open("s3://dcp/nothing/")
    with pytest.raises(NoSuchObjectError, match=r"^s3://dcp/nothing: HTTP 404 Not Found \(NoSuchKey\)$"):
        ckptfs.open("s3://dcp/nothing")


def test_listing_pages_follow_continuation_tokens(s3_env: MotoS3, monkeypatch: pytest.MonkeyPatch) -> None:
    s3_env.client.create_bucket(Bucket="paged")
    for n in range(7):
        s3_env.client.put_object(Bucket="paged", Key=f"p/{n:02d}.bin", Body=b"x" * n)
    s3_env.client.put_object(Bucket="paged", Key="p/sub/deeper.bin", Body=b"not directly below")
    s3_env.client.put_object(Bucket="paged", Key="other.bin", Body=b"not below")
    from ckptfs.sources.remote import s3_list

    pages = []
    original = s3_list._get
    monkeypatch.setattr(s3_list, "PAGE_KEYS", 3)
    monkeypatch.setattr(s3_list, "_get", lambda *args: pages.append(args[1]) or original(*args))
    prefix = open_source("s3://paged/p/")
    assert isinstance(prefix, PrefixSet)
    assert prefix.names() == {f"{n:02d}.bin": n for n in range(7)}
    assert len(pages) == 3 and all("max-keys=3" in page for page in pages)
    assert "continuation-token=" in pages[-1]
    with pytest.raises(NoSuchObjectError, match=r"^s3://no-such-bucket/p/: cannot list the prefix: HTTP 404 Not "
                                                r"Found \(NoSuchBucket\)$"):
        open_source("s3://no-such-bucket/p/").names()  # type: ignore[attr-defined]


def test_an_fsspec_prefix(dcp_dirs: dict[str, Path]) -> None:
    fsspec = pytest.importorskip("fsspec")
    memory = fsspec.filesystem("memory")
    for name in ("sim3", "ranks"):
        for file in dcp_dirs[name].iterdir():
            memory.pipe(f"/prefix/{name}/{file.name}", file.read_bytes())
        with ckptfs.open(dcp_dirs[name]) as ck:
            expected = tensor_bytes(ck)
        for url in (f"memory://prefix/{name}/", f"memory://prefix/{name}"):
            with ckptfs.open(url) as ck:
                assert isinstance(ck.source, PrefixSet) and tensor_bytes(ck) == expected


def test_member_names_stay_below_the_prefix() -> None:
    prefix = open_source("http://127.0.0.1:9/dir/", RemoteOptions())
    assert isinstance(prefix, PrefixSet)
    for name in ("../x", "a/b", ".", "..", "", "x?y", "x#y"):
        with pytest.raises(SourceError, match="is not the name of an object directly below the prefix"):
            prefix.open(name)


def test_requests_and_bytes_are_bounded_by_what_a_read_needs(nginx: Nginx, tmp_path: Path) -> None:
    torch.manual_seed(0)
    state = {"model": {f"layer{i}": torch.randn(512, 512) for i in range(8)}, "step": 1}  # 1 MiB each
    simulate_ranks(state, {f"model.layer{i}": (0, 4) for i in range(8)}, nginx.root / "bounded", world=4)
    total = sum(p.stat().st_size for p in (nginx.root / "bounded").iterdir())
    mark = nginx.mark()
    with ckptfs.open(f"{nginx.url}/bounded/") as ck:
        opening = nginx.since(mark)
        assert len(opening) <= 3 and sum(r.sent for r in opening) <= (2 << 20) + 2 * 65536, opening
        mark = nginx.mark()
        assert ck.read(ck.tensor(("model", "layer5"))) == raw_bytes(state["model"]["layer5"])
        reading = nginx.since(mark)
        assert all(r.status == 206 and r.range.startswith("bytes=") for r in reading), reading
        assert sum(r.sent for r in reading) <= (2 << 20) + (16 << 20), reading
        assert sum(r.sent for r in reading) < total / 2
        assert len(reading) <= 4 * (1 + 4), reading  # per file: its opening GET, the chunk's archive parts
