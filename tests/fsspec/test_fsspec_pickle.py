"""A pickled ``ckpt`` file system (what Dask and Ray send to workers) reads the object version the client opened,
with the client's parse: a replaced object raises in the copy, and the copy's first read makes no opening GET.
Against moto behind nginx (its log counts requests and bytes), copies unpickled in fresh processes."""

from __future__ import annotations

import io
import pickle
import subprocess
import sys
from pathlib import Path

import fsspec
import pytest
import torch
from remote_servers import MotoS3, Nginx, moto_proxy, moto_s3  # noqa: F401  (fixtures)

import ckptfs.cache
from ckptfs.fsspec import CheckpointFileSystem
from ckptfs.fsspec.pickled import Carried
from ckptfs.limits import Limits

WORKER = """
import pickle, sys
from ckptfs.errors import ObjectChangedError
fs = pickle.loads(sys.stdin.buffer.read())
try:
    data = fs.cat_file(sys.argv[1])
except ObjectChangedError as exc:
    print("ObjectChangedError:", exc)
else:
    sys.stdout.buffer.write(data)
"""


def tensors(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    state = {f"layer{i}.weight": torch.randn(16, 8, generator=generator) for i in range(120)}
    state["embed"] = torch.randn(300, 40, generator=generator)
    return state


def saved(state: dict[str, torch.Tensor]) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def raw(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().view(torch.uint8).numpy().tobytes()


def in_worker(pickled: bytes, path: str) -> bytes:
    """What a fresh process reads of ``path`` through the unpickled file system (or its error's text)."""
    return subprocess.run([sys.executable, "-c", WORKER, path], input=pickled, capture_output=True, check=True,
                          timeout=120).stdout


def s3_options(moto_s3: MotoS3, endpoint: str) -> dict[str, object]:  # noqa: F811
    return {"key": moto_s3.env["AWS_ACCESS_KEY_ID"], "secret": moto_s3.env["AWS_SECRET_ACCESS_KEY"],
            "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}


def test_a_copy_in_another_process_raises_when_the_object_was_replaced(moto_s3: MotoS3,  # noqa: F811
                                                                        moto_proxy: Nginx) -> None:  # noqa: F811
    moto_s3.client.create_bucket(Bucket="pinned")
    moto_s3.client.put_object(Bucket="pinned", Key="model.pt", Body=saved(tensors(1)))
    fs = CheckpointFileSystem(fo="s3://pinned/model.pt", target_options=s3_options(moto_s3, moto_proxy.url))
    assert fs.cat_file("embed") == raw(tensors(1)["embed"])
    pickled = pickle.dumps(fs)
    assert in_worker(pickled, "embed") == raw(tensors(1)["embed"])

    moto_s3.client.put_object(Bucket="pinned", Key="model.pt", Body=saved(tensors(2)))
    mark = moto_proxy.mark()
    answer = in_worker(pickled, "layer7.weight").decode()
    assert answer.startswith("ObjectChangedError: s3://pinned/model.pt: the object was replaced since it was opened")
    assert "open it again (ckptfs.open, a new ckpt:// file system)" in answer
    assert "unmount" not in answer
    requests = moto_proxy.since(mark, at_least=1)
    assert requests and all(r.status == 412 and r.sent < 1024 for r in requests)  # S3's error text, no object byte
    etag = fs.checkpoint.source.pinned[1].strip('"')
    assert all(r.if_match.replace("\\x22", "").strip('"') == etag for r in requests)
    # a file system made now opens the new object
    assert CheckpointFileSystem(fo="s3://pinned/model.pt",
                                target_options=s3_options(moto_s3, moto_proxy.url)).cat_file("embed") == raw(
        tensors(2)["embed"])


def test_a_copy_carries_the_parse_and_makes_no_opening_request(moto_s3: MotoS3,  # noqa: F811
                                                                moto_proxy: Nginx) -> None:  # noqa: F811
    moto_s3.client.create_bucket(Bucket="parsed")
    moto_s3.client.put_object(Bucket="parsed", Key="model.pt", Body=saved(tensors(3)))
    opened = fsspec.open("ckpt://embed::s3://parsed/model.pt", s3=s3_options(moto_s3, moto_proxy.url))
    fs = opened.fs
    assert fs.cat_file("layer3.weight") == raw(tensors(3)["layer3.weight"])
    pickled = pickle.dumps(fs)
    mark = moto_proxy.mark()
    assert in_worker(pickled, "layer9.weight") == raw(tensors(3)["layer9.weight"])
    requests = moto_proxy.since(mark, at_least=1)
    assert len(requests) == 1 and requests[0].range.startswith("bytes=") and not requests[0].range.startswith(
        "bytes=-")  # one ranged GET of the tensor: no suffix GET, no parse
    # copies unpickled in one process share one file system: one decode, whatever the number of tasks
    first, second = pickle.loads(pickled), pickle.loads(pickle.dumps(fs))
    assert first is second and first is not fs
    assert first.cat_file("embed") == raw(tensors(3)["embed"])


def test_a_carried_parse_that_does_not_check_is_parsed_again(tmp_path: Path) -> None:
    path = tmp_path / "local.pt"
    path.write_bytes(saved(tensors(4)))
    fs = CheckpointFileSystem(fo=str(path))
    encoded = fs.checkpoint.encoded_parse()
    assert encoded is not None
    flipped = bytearray(encoded)
    flipped[-9] ^= 0xFF  # the digest no longer checks
    for carried in (Carried.pack(bytes(flipped)), b"not deflated", Carried.pack(encoded)[:-5]):
        copy = CheckpointFileSystem(fo=str(path), _carried=Carried(None, carried))
        assert copy.cat_file("embed") == raw(tensors(4)["embed"])
        assert len(copy.checkpoint.tensors) == 121
    bomb = Carried(None, Carried.pack(bytes(1 << 20)))
    assert bomb.unpacked(Limits(max_pickle_bytes=1 << 16)) is None  # inflates past 4 bytes per pickle byte
    # the file rewritten: its state is another key, so the carried parse is not used
    path.write_bytes(saved(tensors(5)))
    again = CheckpointFileSystem(fo=str(path), _carried=Carried(None, Carried.pack(encoded)))
    assert again.cat_file("embed") == raw(tensors(5)["embed"])


def test_cache_dir_keeps_the_parse_for_the_next_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ckptfs.cache, "MIN_TENSORS_SCANNED", {})  # its 121 tensors: a zip cached on any parse path
    path = tmp_path / "cached.pt"
    path.write_bytes(saved(tensors(6)))
    fs = fsspec.filesystem("ckpt", fo=str(path), cache_dir=str(tmp_path / "cache"))
    assert fs.cat_file("embed") == raw(tensors(6)["embed"])
    entries = list((tmp_path / "cache").rglob("*"))
    assert any(entry.is_file() for entry in entries)
    again = fsspec.filesystem("ckpt", fo=str(path), cache_dir=str(tmp_path / "cache"))
    assert again is not fs and again.cat_file("layer0.weight") == raw(tensors(6)["layer0.weight"])


def test_a_mount_says_unmount_a_program_says_open_again() -> None:
    from ckptfs.errors import ObjectChangedError

    error = ObjectChangedError("the object was replaced since it was opened (If-Match failed); "
                               + ObjectChangedError.REOPEN, "s3://b/m.pt")
    assert str(error) == ("s3://b/m.pt: the object was replaced since it was opened (If-Match failed); open it again "
                          "(ckptfs.open, a new ckpt:// file system) to read the new version")
    assert error.for_mount() == ("s3://b/m.pt: the object was replaced since it was opened (If-Match failed); "
                                 "unmount and mount it again")
