"""``ckpt://KEY::s3://…`` and ``::http://…`` chains: the target is read by ckptfs's own checked ranged GETs (pinned,
retried, cached) with the storage options fsspec gives it; options ckptfs has no equivalent for go to fsspec's
backend. Against nginx and moto, bytes equal to torch's."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import fsspec
import pytest
import torch
from dcp_writers import simulate_ranks
from remote_servers import FaultProxy, MotoS3, Nginx, fault_proxy, moto_s3, nginx  # noqa: F401  (fixtures)

from ckptfs.errors import SourceError
from ckptfs.fsspec.targets import remote_options
from ckptfs.sources import FsspecSource, PrefixSet, RemoteOptions
from ckptfs.sources.remote.source import RemoteSource


def tensors() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(15)
    return {"embed": torch.randn(300, 40, generator=generator), "bias": torch.arange(7, dtype=torch.int16)}


def raw(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().view(torch.uint8).numpy().tobytes()


def saved() -> bytes:
    buffer = io.BytesIO()
    torch.save(tensors(), buffer)
    return buffer.getvalue()


def test_an_http_chain_reads_by_ckptfs_ranged_gets(nginx: Nginx) -> None:  # noqa: F811
    pytest.importorskip("aiohttp", reason="fsspec's http:// layer (pip install aiohttp) splits the chain")
    (nginx.root / "chain.pt").write_bytes(saved())
    mark = nginx.mark()
    opened = fsspec.open(f"ckpt://embed::{nginx.url}/chain.pt")
    assert isinstance(opened.fs.checkpoint.source, RemoteSource)
    with opened as f:
        assert f.read() == raw(tensors()["embed"])
    requests = nginx.since(mark)
    assert [r.range for r in requests] == ["bytes=-2097152"]  # the whole small file in our 2 MiB suffix GET: no HEAD
    assert opened.fs.cat_file("bias") == raw(tensors()["bias"])


def test_an_s3_chain_takes_s3fs_style_options(moto_s3: MotoS3, tmp_path: Path) -> None:  # noqa: F811
    pytest.importorskip("s3fs", reason="fsspec's s3:// layer (pip install s3fs) splits the chain")
    moto_s3.client.create_bucket(Bucket="chains")
    moto_s3.client.put_object(Bucket="chains", Key="run/model.pt", Body=saved())
    options = {"key": moto_s3.env["AWS_ACCESS_KEY_ID"], "secret": moto_s3.env["AWS_SECRET_ACCESS_KEY"],
               "client_kwargs": {"endpoint_url": moto_s3.url, "region_name": "us-east-1"}}
    opened = fsspec.open("ckpt://embed::s3://chains/run/model.pt", s3=options)
    assert isinstance(opened.fs.checkpoint.source, RemoteSource)
    assert opened.fs.checkpoint.path == "s3://chains/run/model.pt"
    with opened as f:
        assert f.read() == raw(tensors()["embed"])
    wrong = {**options, "secret": "not-the-secret"}
    with pytest.raises(SourceError, match=r"^s3://chains/run/model\.pt: HTTP 403 Forbidden") as refused:
        fsspec.open("ckpt://embed::s3://chains/run/model.pt", s3=wrong).open()
    assert "not-the-secret" not in str(refused.value)
    # a prefix is a DCP directory
    state = {"model": {"w": torch.arange(24, dtype=torch.float32).reshape(6, 4)}, "step": 3}
    simulate_ranks(state, {"model.w": (0, 2)}, tmp_path / "dcp", world=2)
    for file in (tmp_path / "dcp").iterdir():
        moto_s3.client.put_object(Bucket="chains", Key=f"run/dcp/{file.name}", Body=file.read_bytes())
    directory = fsspec.open("ckpt://model/w::s3://chains/run/dcp/", s3=options)
    assert isinstance(directory.fs.checkpoint.source, PrefixSet)
    with directory as f:
        assert f.read() == raw(state["model"]["w"])
    # an option ckptfs has no equivalent for: s3fs reads the target
    fallback = fsspec.open("ckpt://bias::s3://chains/run/model.pt", s3={**options, "default_fill_cache": False})
    assert isinstance(fallback.fs.checkpoint.source, FsspecSource)
    with fallback as f:
        assert f.read() == raw(tensors()["bias"])


@pytest.mark.parametrize("scheme, options, expected", [
    ("s3", {}, RemoteOptions()),
    ("s3", {"anon": True, "endpoint_url": "http://h:1"}, RemoteOptions(endpoint_url="http://h:1", anonymous=True)),
    ("s3", {"key": "AK", "secret": "S", "token": None, "client_kwargs": {"region_name": "eu-west-3"}, "retries": 2},
     RemoteOptions(region="eu-west-3", storage_options={"access_key_id": "AK", "secret_access_key": "S",
                                                          "retries": "2"})),
    ("s3", {"requester_pays": True}, None),
    ("s3", {"client_kwargs": {"verify": False}}, None),
    ("https", {"timeout": 5}, RemoteOptions(storage_options={"timeout": "5"})),
    ("https", {"headers": {"Authorization": "Bearer x"}}, None),
    ("s3", {"max_connections": 4, "anon": True}, RemoteOptions(anonymous=True, max_connections=4)),
    ("https", {"max_connections": "2"}, RemoteOptions(max_connections=2)),
])
def test_fsspec_options_translate_or_fall_back(scheme: str, options: dict[str, Any],
                                               expected: RemoteOptions | None) -> None:
    assert remote_options(scheme, options) == expected


@pytest.mark.parametrize("bad", [0, 257, "many", True, 2.5])
def test_a_max_connections_option_out_of_bounds_is_refused(bad: Any) -> None:
    message = f"storage option max_connections={bad!r}: expected a whole number from 1 to 256"
    with pytest.raises(SourceError, match=f"^{re.escape(message)}$"):
        remote_options("s3", {"max_connections": bad})


def test_max_connections_bounds_the_gets_of_a_ckpt_file_system(nginx: Nginx,  # noqa: F811
                                                               fault_proxy: FaultProxy) -> None:  # noqa: F811
    big = torch.randn(12 << 20, generator=torch.Generator().manual_seed(16))  # 48 MiB: read in parts
    torch.save({"big": big}, nginx.root / "connections.pt")
    for connections, most in ((1, 1), (3, 3)):
        fs = fsspec.filesystem("ckpt", fo=f"{fault_proxy.url}/connections.pt",
                               target_options={"max_connections": connections})
        source = fs.checkpoint.source
        assert isinstance(source, RemoteSource) and source._parts.connections == connections  # noqa: SLF001
        fault_proxy.most_active = 0
        assert fs.cat_file("big") == raw(big)
        assert 1 <= fault_proxy.most_active <= most + 1  # its connections, and the reading thread's own
