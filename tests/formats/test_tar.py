"""TAR checkpoints of torch ≤ 0.3: the test writer's output is what torch 2.13 reads, and ckptfs reads it the same."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import pytest
import torch
from corpus import torch_bytes
from counting import CountingSource
from tar_writer import TarCheckpoint, ordered_dict, p_int, p_str, tar_checkpoint

import ckptfs
from ckptfs.errors import CorruptCheckpointError, LimitExceededError, NotACheckpointError
from ckptfs.formats.detect import open_parsed
from ckptfs.formats.prefetch import TAIL_BYTES
from ckptfs.limits import Limits
from ckptfs.sources import open_source


def _state() -> dict[str, Any]:
    weights = torch.linspace(-1, 1, 12, dtype=torch.float32).reshape(3, 4)
    return {
        "w": weights, "wt": weights.t(), "row": weights[1], "cols": weights[:, 1:3],
        "d": torch.arange(6, dtype=torch.float64).reshape(2, 3), "h": torch.tensor([0.5, -2.0, 65504.0]).half(),
        "l": torch.tensor([7, -8, 1 << 40]), "i": torch.tensor([1, -2, 1 << 30], dtype=torch.int32),
        "s": torch.tensor([-300, 300], dtype=torch.int16), "c": torch.tensor([-1, 1], dtype=torch.int8),
        "b": torch.tensor([0, 255], dtype=torch.uint8), "empty": torch.empty(0), "epoch": 3,
    }


@pytest.fixture(scope="module", params=[False, True], ids=["py3", "py2"])
def tar_file(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tar") / "old.pt"
    path.write_bytes(tar_checkpoint(_state(), py2=request.param))
    return path


def test_torch_reads_the_writers_output(tar_file: Path) -> None:
    assert tarfile.is_tarfile(tar_file)
    loaded = torch.load(tar_file, weights_only=False)
    state = _state()
    assert list(loaded) == list(state)
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            assert loaded[key].dtype == value.dtype and loaded[key].stride() == value.stride(), key
            assert torch.equal(loaded[key], value), key
    assert loaded["epoch"] == 3


def test_ckptfs_reads_what_torch_loads(tar_file: Path) -> None:
    loaded = torch.load(tar_file, weights_only=False)
    with ckptfs.open(tar_file) as ck:
        assert ck.format == "tar" and ck.byteorder == "little"
        assert list(ck.root) == list(loaded)
        for key, value in loaded.items():
            if not isinstance(value, torch.Tensor):
                assert ck.root[key] == value
                continue
            tensor = ck.root[key]
            assert (tensor.dtype.name, tensor.shape, tensor.stride, tensor.storage_offset) == (
                str(value.dtype).removeprefix("torch."), tuple(value.shape), value.stride(), value.storage_offset())
            assert ck.read(tensor) == torch_bytes(value), key
        assert ck.root["w"].storage is ck.root["wt"].storage is ck.root["cols"].storage


def test_opening_reads_metadata_only(tar_file: Path) -> None:
    source = CountingSource(open_source(str(tar_file)))
    parsed = open_parsed(source, Limits())
    assert parsed.format == "tar" and len(parsed.storages) == 9  # w, wt, row and cols share one
    data = [(s.offset, s.offset + s.nbytes) for s in parsed.storages if s.nbytes]
    tail = min(source.size, TAIL_BYTES)
    assert source.reads[0] == (source.size - tail, tail), "every format's opening reads the tail first"
    for offset, length in source.reads[1:]:
        assert not any(offset < end and start < offset + length and length > 4096 for start, end in data), (
            offset, length)


def test_storage_views_of_old_torch(tmp_path: Path) -> None:
    root = torch.arange(8, dtype=torch.float64)
    writer = TarCheckpoint()
    view_key = writer.view(root, 2, 5)
    over_view = torch.empty(5, dtype=torch.float64).as_strided((2,), (2,), 1)
    body = ordered_dict([(p_str("root", False), writer.tensor(root)),
                         (p_str("view", False), writer.tensor(over_view, storage_key=view_key))])
    path = tmp_path / "views.pt"
    path.write_bytes(writer.bytes(body))
    loaded = torch.load(path, weights_only=False)
    assert loaded["view"].tolist() == [3.0, 5.0]
    with ckptfs.open(path) as ck:
        view = ck.root["view"]
        assert view.storage.base is ck.root["root"].storage and view.storage.base_offset == 2
        assert ck.read(view) == torch_bytes(loaded["view"])


def test_module_class_persistent_ids_are_their_class(tmp_path: Path) -> None:
    writer = TarCheckpoint()
    t = torch.ones(2)
    body = ordered_dict([(p_str("cls", False), b"(" + b"cx.y\nNet\n" + p_str("net.py", False) + p_str("src", False)
                          + b"tQ"), (p_str("t", False), writer.tensor(t))])
    path = tmp_path / "module.pt"
    path.write_bytes(writer.bytes(body))
    with ckptfs.open(path) as ck:
        assert ck.root["cls"].qualname == "x.y.Net" and ck.read(ck.root["t"]) == torch_bytes(t)


def _rewritten(member: str, data: bytes | None) -> bytes:
    """A one-tensor TAR checkpoint with one member's bytes replaced (None: the member left out)."""
    with tarfile.open(fileobj=io.BytesIO(tar_checkpoint({"t": torch.arange(4.0)}))) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]
    if data is None:
        del members[member]
    else:
        members[member] = data
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:", format=tarfile.PAX_FORMAT) as tar:
        for name, content in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return out.getvalue()


P = b"\x80\x02"
BAD = {
    "storage_count_lie": (_rewritten("storages", P + p_int(3, False) + b"."), CorruptCheckpointError,
                          r"a pickle of tar member 'storages' is truncated"),
    "huge_storage": (_rewritten("storages", P + b"K\x01." + P + b"(K\x01X\x03\x00\x00\x00cpuctorch\nFloatStorage\nt."
                                + (1 << 60).to_bytes(8, "little")), CorruptCheckpointError,
                     r"tar member 'storages' ends inside a storage's 4611686018427387904 bytes"),
    "tensor_count_huge": (_rewritten("tensors", P + p_int(10**9, False) + b"."), LimitExceededError,
                          r"1000000000 tensors exceed"),
    "no_pickle": (_rewritten("pickle", None), NotACheckpointError, r"no 'pickle' member"),
    "unknown_tensor_key": (_rewritten("pickle", P + b"X\x03\x00\x00\x00999Q."), CorruptCheckpointError,
                           r"the pickle names tensor '999', which the tensors member lacks"),
    "truncated": (tar_checkpoint({"t": torch.arange(4.0)})[:1500], CorruptCheckpointError,
                  r"tar member at offset 1024 \(\d+ bytes\) runs past the end of the file|truncated"),
}


@pytest.mark.parametrize("name", BAD)
def test_broken_tar_checkpoints_fail_clearly(tmp_path: Path, name: str) -> None:
    data, error, reason = BAD[name]
    path = tmp_path / f"{name}.pt"
    path.write_bytes(data)
    with pytest.raises(error, match=reason):
        ckptfs.open(path)
