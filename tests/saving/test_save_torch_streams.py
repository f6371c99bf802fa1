"""``save_torch`` beyond the source forms: the corpus, random trees, how bytes move, interrupts and full disks."""

from __future__ import annotations

import os
import resource
import signal
import struct
import subprocess
import sys
import threading
import zipfile
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch
from corpus import CorpusFile, save_zip, torch_bytes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_save_torch import assert_same, loaded

import ckptfs
import ckptfs.saving.output
import ckptfs.saving.torch_save
from ckptfs.cli.main import INTERRUPTED, main
from ckptfs.fs.safetensors import key_name
from ckptfs.saving import save_torch
from ckptfs.saving.output import CHUNK

CLI = [sys.executable, "-m", "ckptfs.cli"]


def _at(value: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        if isinstance(value, dict) and key in value:
            value = value[key]
        elif isinstance(value, (list, tuple)) and type(key) is int and key < len(value):
            value = value[key]
        else:
            return None
    return value


def test_every_corpus_tensor_is_written_or_listed(corpus: dict[str, CorpusFile], tmp_path: Path) -> None:
    for name, entry in corpus.items():
        out = tmp_path / f"{name}.pt"
        with ckptfs.open(entry.path) as ck:
            left_out = {gone for gone, _ in save_torch(ck, out)}
        plain, mapped = loaded(out)
        for path, t in entry.expected.tensors.items():
            dotted = ".".join(key_name(key) for key in path)
            ours = _at(plain, path)
            if isinstance(ours, torch.Tensor):
                assert (ours.dtype, ours.shape) == (t.dtype, t.shape), (name, dotted)
                assert torch_bytes(ours) == torch_bytes(t) == torch_bytes(_at(mapped, path)), (name, dotted)
            else:
                assert any(dotted == gone or dotted.startswith(gone + ".") or not gone for gone in left_out), (
                    name, dotted)


_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int8, torch.uint8,
           torch.bool, torch.complex64, torch.uint16, torch.float8_e5m2]


@st.composite
def _tensors(draw: st.DrawFn) -> torch.Tensor:
    dtype = draw(st.sampled_from(_DTYPES))
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
    seed = draw(st.integers(0, 2**16))
    base = torch.randint(0, 256, (max(1, torch.Size(shape).numel()) * dtype.itemsize,), dtype=torch.uint8,
                         generator=torch.Generator().manual_seed(seed))
    tensor = base.view(dtype)[:torch.Size(shape).numel()].reshape(shape)
    if draw(st.booleans()) and tensor.dim() >= 2:
        tensor = tensor.transpose(0, 1)
    return tensor


_leaves = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text() | st.binary()
           | _tensors())
_trees = st.recursive(_leaves, lambda inner: st.lists(inner, max_size=4) | st.lists(inner, max_size=4).map(tuple)
                      | st.dictionaries(st.text(max_size=5) | st.integers(), inner, max_size=4), max_leaves=20)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tree=st.dictionaries(st.text(max_size=8), _trees, max_size=5))
def test_random_trees_load_back_as_saved(tree: dict[str, Any], tmp_path: Path) -> None:
    source = save_zip(tree, tmp_path / "random.pt")
    with ckptfs.open(source) as ck:
        assert save_torch(ck, tmp_path / "out.pt") == []
    for value in loaded(tmp_path / "out.pt"):
        assert_same(value, torch.load(source, weights_only=False))
    os.unlink(tmp_path / "out.pt")


@pytest.fixture
def big(tmp_path: Path) -> Path:
    """Storages of more than one copy chunk, and a view that keeps only part of one."""
    gen = torch.Generator().manual_seed(3)
    return save_zip({"a": torch.randn(CHUNK // 4 + 1000, generator=gen), "b": torch.randn(300, generator=gen),
                     "c": torch.arange(CHUNK // 8 * 3)[5:]}, tmp_path / "big.pt")


def test_stored_bytes_move_by_the_kernel_in_bounded_steps(big: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    steps: list[int] = []
    copy_file_range = ckptfs.saving.output._copy_file_range

    def counted(source: int, out: int, count: int, *offsets: int) -> int:
        steps.append(count)
        return copy_file_range(source, out, count, *offsets)

    monkeypatch.setattr(ckptfs.saving.output, "_copy_file_range", counted)
    with ckptfs.open(big) as ck:
        save_torch(ck, tmp_path / "out.pt")
        assert sum(steps) == sum(s.nbytes for s in {id(t.storage): t.storage for t in ck.tensors}.values())
    assert max(steps) == CHUNK
    assert_same(torch.load(tmp_path / "out.pt", weights_only=True), torch.load(big, weights_only=True))


def test_bytes_that_must_be_transformed_are_read_a_chunk_at_a_time(big: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import zipfile

    deflated = tmp_path / "deflated.pt"
    with zipfile.ZipFile(big) as zin, zipfile.ZipFile(deflated, "w", zipfile.ZIP_DEFLATED) as zout:
        for name in zin.namelist():
            zout.writestr(name, zin.read(name))
    reads: list[int] = []
    with ckptfs.open(deflated) as ck:
        read = ck.read

        def counted(tensor: Any, offset: int = 0, size: int | None = None) -> bytes:
            data = read(tensor, offset, size)
            reads.append(len(data))
            return data

        monkeypatch.setattr(ck, "read", counted)
        save_torch(ck, tmp_path / "out.pt")
    assert reads == [CHUNK, 4000, 1200, CHUNK, CHUNK, CHUNK]  # a: CHUNK + 4000 bytes, b: 1200, c: 3 CHUNKs
    assert_same(torch.load(tmp_path / "out.pt", weights_only=True), torch.load(big, weights_only=True))


def test_ctrl_c_leaves_nothing(big: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    """A real SIGINT in the middle of a storage's bytes."""
    copy = ckptfs.saving.torch_save._copy_record

    def interrupted(*args: Any) -> None:
        copy(*args)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(ckptfs.saving.torch_save, "_copy_record", interrupted)
    assert main(["convert", str(big), str(tmp_path / "out.pt")]) == INTERRUPTED
    assert capsys.readouterr().err == "ckptfs: interrupted\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.pt"]


def _small_file_limit() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit then fail with EFBIG, as on a full disk
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))


def test_a_full_disk_is_one_line_and_leaves_nothing(big: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.pt"
    done = subprocess.run([*CLI, "convert", str(big), str(out)], capture_output=True, text=True,
                          preexec_fn=_small_file_limit)
    assert (done.returncode, done.stderr) == (1, f"ckptfs: {out}: File too large\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.pt"]


def test_depth_is_bounded_by_the_limit_and_a_deep_tree_is_written(tmp_path: Path) -> None:
    from ckptfs.errors import LimitExceededError
    from ckptfs.limits import Limits
    from ckptfs.saving.torch_pickle import TorchPickler

    deep: Any = torch.ones(1)
    for _ in range(200):
        deep = {"d": [deep]}
    source = save_zip({"root": deep}, tmp_path / "deep.pt")
    with ckptfs.open(source) as ck:
        with pytest.raises(LimitExceededError, match=r"nests deeper than 300 \(limit max_tree_depth\)"):
            TorchPickler(ck.root, Limits(max_tree_depth=300)).dump()
        assert save_torch(ck, tmp_path / "out.pt") == []
    value = torch.load(tmp_path / "out.pt", weights_only=True)["root"]
    for _ in range(200):
        value = value["d"][0]
    assert torch.equal(value, torch.ones(1))


def test_an_error_behind_the_copy_is_one_line_and_leaves_nothing(big: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The CRC-32s are read on a thread beside the copy: its failure still ends the command, as the copy's would."""

    def unreadable(*args: Any) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(ckptfs.saving.output.Crc, "carry", unreadable)
    out = tmp_path / "out.pt"
    before = set(threading.enumerate())  # earlier tests' remote sources may still hold their GET threads
    assert main(["convert", str(big), str(out)]) == 1
    assert capsys.readouterr().err == f"ckptfs: {out}: Input/output error\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.pt"]
    assert [t.name for t in set(threading.enumerate()) - before if t.name.startswith("ckptfs-")] == []


def test_descriptors_written_behind_hold_each_record_s_crc(big: Path, tmp_path: Path) -> None:
    with ckptfs.open(big) as ck:
        save_torch(ck, tmp_path / "out.pt")
    with zipfile.ZipFile(tmp_path / "out.pt") as archive:
        assert archive.testzip() is None
        raw = (tmp_path / "out.pt").read_bytes()
        for info in archive.infolist():
            if info.file_size:
                local_extra = int.from_bytes(raw[info.header_offset + 28:info.header_offset + 30], "little")
                start = info.header_offset + 30 + len(info.filename.encode()) + local_extra
                end = start + info.file_size
                assert raw[end:end + 8] == struct.pack("<II", 0x08074B50, zlib.crc32(raw[start:end]))
