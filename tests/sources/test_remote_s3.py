"""s3:// sources: the SigV4 signer against botocore's, and a real moto S3 server (versioned and plain buckets)."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
import torch
from remote_servers import MotoS3

import ckptfs
from ckptfs.errors import ObjectChangedError, SourceError
from ckptfs.sources import RemoteOptions, open_source
from ckptfs.sources.remote.aws_config import s3_settings
from ckptfs.sources.remote.sigv4 import Credentials, signed_headers

STAMP = 1_780_000_000.0


@pytest.mark.parametrize("path, query, token", [
    ("/bkt/run%207/model.pt", {}, None),
    ("/bkt/a/%C3%A9%2B%3D.pt", {"versionId": "3/L4kqtJl+40nDkU=="}, "session-token"),
])
def test_the_signature_is_botocores(path: str, query: dict[str, str], token: str | None) -> None:
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials as BotoCredentials

    credentials = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token)
    ours = signed_headers(credentials, "eu-west-3", "127.0.0.1:9000", path, query, now=STAMP)
    from urllib.parse import quote

    url = "http://127.0.0.1:9000" + path + ("?" + "&".join(f"{k}={quote(v, safe='')}" for k, v in query.items())
                                             if query else "")
    request = AWSRequest(method="GET", url=url, headers={})
    request.context["timestamp"] = ours["x-amz-date"]
    auth = S3SigV4Auth(BotoCredentials(*credentials), "s3", "eu-west-3")
    auth._modify_request_before_signing(request)  # noqa: SLF001
    canonical = auth.canonical_request(request)
    signature = auth.signature(auth.string_to_sign(request, canonical), request)
    assert ours["Authorization"].endswith(f"Signature={signature}")


def test_settings_follow_the_aws_chain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION",
                 "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "config").write_text("[profile work]\nregion = eu-north-1\nendpoint_url = http://127.0.0.1:1\n")
    (tmp_path / "credentials").write_text("[work]\naws_access_key_id = AKWORK\naws_secret_access_key = s3cr3t\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_PROFILE", "work")
    settings = s3_settings(RemoteOptions(), "s3://b/k")
    assert (settings.endpoint_url, settings.region) == ("http://127.0.0.1:1", "eu-north-1")
    assert settings.credentials is not None and settings.credentials() == Credentials("AKWORK", "s3cr3t", None)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:2")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:3")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "envsecret")
    monkeypatch.setenv("AWS_REGION", "ap-south-1")
    settings = s3_settings(RemoteOptions(), "s3://b/k")
    assert (settings.endpoint_url, settings.region) == ("http://127.0.0.1:3", "ap-south-1")
    assert settings.credentials is not None and settings.credentials().access_key == "AKENV"
    settings = s3_settings(RemoteOptions(endpoint_url="http://127.0.0.1:4", region="us-west-2", anonymous=True),
                           "s3://b/k")
    assert settings == (("http://127.0.0.1:4", "us-west-2", None))
    with pytest.raises(SourceError, match=r"s3://b/k: storage option 'colour' is not one an s3:// source takes"):
        s3_settings(RemoteOptions(storage_options={"colour": "blue"}), "s3://b/k")
    assert "s3cr3t" not in repr(Credentials("AKWORK", "s3cr3t"))


def saved(tensors: dict[str, torch.Tensor]) -> bytes:
    buffer = io.BytesIO()
    torch.save(tensors, buffer)
    return buffer.getvalue()


def test_a_versioned_object_is_read_at_its_first_version(s3_env: MotoS3) -> None:
    client = s3_env.client
    client.create_bucket(Bucket="versioned")
    client.put_bucket_versioning(Bucket="versioned", VersioningConfiguration={"Status": "Enabled"})
    first = {"w": torch.arange(300_000, dtype=torch.float32), "b": torch.ones(3)}
    client.put_object(Bucket="versioned", Key="run 7/model.pt", Body=saved(first))
    with ckptfs.open("s3://versioned/run 7/model.pt") as ck:
        assert ck.path == "s3://versioned/run 7/model.pt"
        client.put_object(Bucket="versioned", Key="run 7/model.pt", Body=saved({"w": -torch.arange(300_000.0),
                                                                                "b": torch.zeros(3)}))
        assert ck.read(ck.tensor(("w",))) == first["w"].numpy().tobytes()  # versionId pinned: still the first


def test_a_replaced_object_in_a_plain_bucket_is_an_error(s3_env: MotoS3) -> None:
    client = s3_env.client
    client.create_bucket(Bucket="plain")
    tensors = {"w": torch.arange(1_000_000, dtype=torch.float32)}
    client.put_object(Bucket="plain", Key="m.pt", Body=saved(tensors))
    with ckptfs.open("s3://plain/m.pt") as ck:
        assert ck.read(ck.tensor(("w",)), 0, 64) == tensors["w"].numpy().tobytes()[:64]
        client.put_object(Bucket="plain", Key="m.pt", Body=saved({"w": torch.zeros(1_000_000)}))
        with pytest.raises(ObjectChangedError, match=r"s3://plain/m\.pt: the object was replaced"):
            ck.read(ck.tensor(("w",)), 0, 4_000_000)


def test_missing_objects_and_buckets_are_one_line_errors(s3_env: MotoS3) -> None:
    s3_env.client.create_bucket(Bucket="empty")
    with pytest.raises(SourceError, match=r"^s3://empty/nothing\.pt: HTTP 404 Not Found \(NoSuchKey\)$"):
        open_source("s3://empty/nothing.pt")
    with pytest.raises(SourceError, match=r"^s3://no-such-bucket/m\.pt: HTTP 404 Not Found \(NoSuchBucket\)$"):
        open_source("s3://no-such-bucket/m.pt")


def test_a_wrong_region_is_corrected_by_the_bucket_region_aws_names() -> None:
    from types import SimpleNamespace

    from ckptfs.sources.remote.aws_config import S3Settings
    from ckptfs.sources.remote.s3_endpoint import S3Endpoint

    endpoint = S3Endpoint("s3://bucket/k/m.pt", S3Settings(None, "us-east-1", None))
    assert (endpoint.host, endpoint.target(None)) == ("bucket.s3.us-east-1.amazonaws.com", "/k/m.pt")
    answer = SimpleNamespace(getheader=lambda name: "eu-central-1" if name == "x-amz-bucket-region" else None)
    moved = endpoint.moved(301, answer)  # type: ignore[arg-type]
    assert moved is not None and (moved.host, moved.region) == ("bucket.s3.eu-central-1.amazonaws.com", "eu-central-1")
    assert moved.moved(301, answer) is None  # type: ignore[arg-type]
    dotted = S3Endpoint("s3://my.bucket/m.pt", S3Settings(None, "us-east-1", None))
    assert (dotted.host, dotted.target("v 1")) == ("s3.us-east-1.amazonaws.com", "/my.bucket/m.pt?versionId=v%201")


def test_the_cli_reads_s3_urls_and_says_what_is_missing_in_one_line(s3_env: MotoS3) -> None:
    from mount.helpers import run_cli

    s3_env.client.create_bucket(Bucket="cli")
    s3_env.client.put_object(Bucket="cli", Key="m.pt", Body=saved({"w": torch.ones(2, 3)}))
    env = {**os.environ}
    listed = run_cli("ls", "--json", "s3://cli/m.pt", env=env)
    assert listed.returncode == 0 and '"dtype": "float32", "shape": [2, 3]' in listed.stdout, listed.stderr
    missing = run_cli("info", "s3://cli/nothing.pt", env=env)
    assert (missing.returncode, missing.stdout) == (1, "")
    assert missing.stderr == "ckptfs: s3://cli/nothing.pt: HTTP 404 Not Found (NoSuchKey)\n"
    anonymous = run_cli("ls", "s3://cli/m.pt", "--anonymous", "--storage-option", "colour=blue", env=env)
    wrong = run_cli("ls", "s3://cli/m.pt", env={**env, "AWS_SECRET_ACCESS_KEY": "wrong"})
    assert wrong.stderr == "ckptfs: s3://cli/m.pt: HTTP 403 Forbidden (SignatureDoesNotMatch)\n"
    assert anonymous.stderr == ("ckptfs: s3://cli/m.pt: storage option 'colour' is not one an s3:// source takes "
                                "(access_key_id, endpoint_url, profile, region, secret_access_key, session_token, "
                                "tail_size, retries, timeout)\n")
