"""s3:// against Ceph's radosgw, a production S3 implementation that checks SigV4 signatures."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from remote_servers import Radosgw

import ckptfs
from ckptfs.errors import ObjectChangedError, SourceError
from ckptfs.sources import RemoteOptions, open_source


def options(radosgw: Radosgw, secret: str | None = None) -> RemoteOptions:
    return RemoteOptions(endpoint_url=radosgw.url, storage_options={
        "access_key_id": radosgw.ACCESS_KEY, "secret_access_key": secret or radosgw.SECRET_KEY})


def test_a_checkpoint_on_radosgw_reads_as_torch_wrote_it(radosgw: Radosgw) -> None:
    tensors = {"w": torch.randn(1 << 20, generator=torch.Generator().manual_seed(5)), "b": torch.arange(7)}
    buffer = io.BytesIO()
    torch.save(tensors, buffer)
    radosgw.client.create_bucket(Bucket="ckpts")
    radosgw.client.put_object(Bucket="ckpts", Key="run 7/model.pt", Body=buffer.getvalue())
    with ckptfs.open("s3://ckpts/run 7/model.pt", remote=options(radosgw)) as ck:
        assert {t.path[0]: ck.read(t) for t in ck} == {k: v.numpy().tobytes() for k, v in tensors.items()}
    source = open_source("s3://ckpts/run 7/model.pt", options(radosgw))
    radosgw.client.put_object(Bucket="ckpts", Key="run 7/model.pt", Body=buffer.getvalue()[::-1])
    with pytest.raises(ObjectChangedError, match=r"^s3://ckpts/run 7/model\.pt: the object was replaced"):
        source.read(0, 100)

def test_radosgw_refuses_a_wrong_signature_and_a_missing_key(radosgw: Radosgw) -> None:
    radosgw.client.create_bucket(Bucket="refusals")
    radosgw.client.put_object(Bucket="refusals", Key="m.pt", Body=b"x" * 1000)
    with pytest.raises(SourceError, match=r"^s3://refusals/m\.pt: HTTP 403 Forbidden \(SignatureDoesNotMatch\)$"):
        open_source("s3://refusals/m.pt", options(radosgw, secret="wrong"))
    with pytest.raises(SourceError, match=r"^s3://refusals/nothing\.pt: HTTP 404 Not Found \(NoSuchKey\)$"):
        open_source("s3://refusals/nothing.pt", options(radosgw))


def test_a_dcp_prefix_without_collectives_is_listed_with_signed_requests(radosgw: Radosgw, tmp_path: Path) -> None:
    from dcp_writers import simulate_ranks_without_collectives

    from ckptfs.sources import PrefixSet
    from ckptfs.sources.remote import s3_list

    state = {"model": {"w": torch.arange(30, dtype=torch.float32).reshape(6, 5), "b": torch.ones(2)}, "step": 4}
    simulate_ranks_without_collectives(state, {"model.w": (0, 3)}, tmp_path / "ranks", world=3)
    radosgw.client.create_bucket(Bucket="dcp")
    for file in (tmp_path / "ranks").iterdir():
        radosgw.client.put_object(Bucket="dcp", Key=f"run 7/ranks/{file.name}", Body=file.read_bytes())
    with ckptfs.open(tmp_path / "ranks") as ck:
        expected = {t.path: ck.read(t) for t in ck}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(s3_list, "PAGE_KEYS", 2)  # several pages: the continuation token is signed too
        for url in ("s3://dcp/run 7/ranks/", "s3://dcp/run 7/ranks"):
            with ckptfs.open(url, remote=options(radosgw)) as ck:
                assert isinstance(ck.source, PrefixSet)
                assert {t.path: ck.read(t) for t in ck} == expected
    with pytest.raises(SourceError, match=r"^s3://dcp/run 7/ranks/: cannot list the prefix: HTTP 403 Forbidden "
                                          r"\(SignatureDoesNotMatch\)$"):
        open_source("s3://dcp/run 7/ranks/", options(radosgw, secret="wrong")).names()  # type: ignore[attr-defined]
