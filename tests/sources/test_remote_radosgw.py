"""s3:// against Ceph's radosgw, a production S3 implementation that checks SigV4 signatures."""

from __future__ import annotations

import io

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
