"""Metadata cache entries of remote objects, against real servers: keyed by the public URL and the version the
opening request pins, a repeat open costs that one request and no parse; a replaced object is parsed again."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from many_tensors import save_many
from object_emulators import Emulator, azurite, fake_gcs, store  # noqa: F401  (fixtures)
from remote_servers import MotoS3, Nginx, moto_s3, nginx, s3_env  # noqa: F401  (fixtures)

import ckptfs.cache
import ckptfs.checkpoint
from ckptfs.cache import source_key
from ckptfs.checkpoint import open_checkpoint
from ckptfs.limits import Limits
from ckptfs.sources import RemoteOptions, open_source

from cache.helpers import entries
from cache.test_cached_equals_parsed import views


def no_parse(*args: Any) -> Any:
    raise AssertionError("parsed although the cache holds the checkpoint")


def open_cached(url: str, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The views of ``url`` opened from its cache entry, the pickle never parsed."""
    with monkeypatch.context() as patch:
        patch.setattr(ckptfs.checkpoint, "open_parsed", no_parse)
        with open_checkpoint(url, cache_dir=cache_dir) as ck:
            return views(ck)


def test_a_repeat_open_is_the_suffix_get_and_no_parse(nginx: Nginx, cache_dir: Path,  # noqa: F811
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    path = save_many(nginx.root / "cached-many.pt", 300)
    url = f"{nginx.url}/cached-many.pt"
    mark = nginx.mark()
    with open_checkpoint(url, cache_dir=cache_dir) as ck:
        parsed = views(ck)
    first = nginx.since(mark, at_least=1)
    assert len(entries(cache_dir)) == 1
    mark = nginx.mark()
    with monkeypatch.context() as patch:
        patch.setattr(ckptfs.checkpoint, "open_parsed", no_parse)
        with open_checkpoint(url, cache_dir=cache_dir) as ck:
            repeat = nginx.since(mark, at_least=1)
            cached = views(ck)
    assert cached == parsed
    assert [(r.range, r.status) for r in repeat] == [(first[0].range, 206)]  # the suffix GET that pins the ETag
    assert repeat[0].range.startswith("bytes=-")
    with open_checkpoint(path) as local:
        assert views(local)["bytes"] == parsed["bytes"]


def test_a_replaced_object_is_parsed_again(nginx: Nginx, cache_dir: Path,  # noqa: F811
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    path = nginx.root / "cached-replaced.pt"
    url = f"{nginx.url}/cached-replaced.pt"
    torch.save({"a": torch.arange(4.0)}, path)
    with open_checkpoint(url, cache_dir=cache_dir) as ck:
        assert [t.path[0] for t in ck.tensors] == ["a"]
    torch.save({"b": torch.ones(3, dtype=torch.int8), "c": torch.zeros(2)}, path)
    future = time.time() + 10
    os.utime(path, (future, future))  # nginx's ETag is its mtime and size
    with open_checkpoint(url, cache_dir=cache_dir) as ck:
        assert [t.path[0] for t in ck.tensors] == ["b", "c"]
        assert ck.read(ck.tensor(("b",))) == b"\x01\x01\x01"
    assert len(entries(cache_dir)) == 2
    assert open_cached(url, cache_dir, monkeypatch)["bytes"] == [b"\x01\x01\x01", b"\0" * 8]


def test_credentials_and_query_are_not_in_the_key(nginx: Nginx, cache_dir: Path,  # noqa: F811
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    save_many(nginx.root / "cached-signed.pt", 5)
    plain = f"{nginx.url}/cached-signed.pt"
    signed = plain.replace("http://", "http://reader:pa55word@") + "?X-Amz-Signature=s3cr3t&X-Amz-Credential=AKID"
    with open_checkpoint(plain, cache_dir=cache_dir) as ck:
        parsed = views(ck)
    source = open_source(signed)
    try:
        key = source_key(source, Limits())
    finally:
        source.close()
    assert key is not None and not any(secret in key for secret in ("pa55word", "s3cr3t", "AKID", "reader"))
    assert open_cached(signed, cache_dir, monkeypatch) == parsed


def test_an_object_without_a_version_is_not_cached(tmp_path: Path, cache_dir: Path) -> None:
    fsspec = pytest.importorskip("fsspec")
    memory = fsspec.filesystem("memory")
    buffer = io.BytesIO()
    torch.save({"a": torch.ones(2)}, buffer)
    memory.pipe("/unversioned/m.pt", buffer.getvalue())
    try:
        with open_checkpoint("memory://unversioned/m.pt", cache_dir=cache_dir) as ck:
            assert source_key(ck.source, Limits()) is None
        assert entries(cache_dir) == []
    finally:
        memory.rm("/unversioned", recursive=True)


def saved(tensors: dict[str, torch.Tensor]) -> bytes:
    buffer = io.BytesIO()
    torch.save(tensors, buffer)
    return buffer.getvalue()


@pytest.mark.parametrize("versioned", [True, False])
def test_s3_objects_hit_until_replaced(s3_env: MotoS3, cache_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                       versioned: bool) -> None:
    client = s3_env.client
    bucket = f"metadata-cache-{'versioned' if versioned else 'plain'}"
    client.create_bucket(Bucket=bucket)
    if versioned:
        client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    client.put_object(Bucket=bucket, Key="run/m.pt", Body=saved({"w": torch.arange(6.0), "b": torch.ones(2)}))
    url = f"s3://{bucket}/run/m.pt"
    with open_checkpoint(url, cache_dir=cache_dir) as ck:
        parsed = views(ck)
    assert open_cached(url, cache_dir, monkeypatch) == parsed
    client.put_object(Bucket=bucket, Key="run/m.pt", Body=saved({"w": -torch.arange(6.0), "b": torch.ones(2)}))
    with open_checkpoint(url, cache_dir=cache_dir) as ck:
        assert ck.read(ck.tensor(("w",))) == (-torch.arange(6.0)).numpy().tobytes()
    assert len(entries(cache_dir)) == 2


def test_gs_and_az_objects_hit_until_replaced(store: Emulator, cache_dir: Path,  # noqa: F811
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Through fsspec: keyed by the generation or ETag its ``info`` gives."""
    options = RemoteOptions(storage_options=store.options)
    store.fs.pipe("ckpts/cached/m.pt", saved({"w": torch.arange(6.0), "b": torch.ones(2)}))
    url = f"{store.scheme}://ckpts/cached/m.pt"
    with open_checkpoint(url, remote=options, cache_dir=cache_dir) as ck:
        assert source_key(ck.source, Limits()) is not None
        parsed = views(ck)
    with monkeypatch.context() as patch:
        patch.setattr(ckptfs.checkpoint, "open_parsed", no_parse)
        with open_checkpoint(url, remote=options, cache_dir=cache_dir) as ck:
            assert views(ck) == parsed
    store.fs.pipe("ckpts/cached/m.pt", saved({"w": -torch.arange(6.0), "b": torch.ones(2)}))
    with open_checkpoint(url, remote=options, cache_dir=cache_dir) as ck:
        assert ck.read(ck.tensor(("w",))) == (-torch.arange(6.0)).numpy().tobytes()
    assert len(entries(cache_dir)) == 2
