"""Format detection by content: every file that is not a checkpoint fails with the right error, naming the file."""

from __future__ import annotations

import io
import json
import pickle
import shutil
import struct
import tarfile
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch

import ckptfs
from ckptfs.errors import CkptfsError, CorruptCheckpointError, NotACheckpointError, SourceError, UnsupportedError
from corpus import CorpusFile, save_zip, write_raw_archive


def _safetensors(path: Path) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(8))


def _npy() -> bytes:
    out = io.BytesIO()
    np.save(out, np.arange(3))
    return out.getvalue()


def _tar(path: Path) -> None:
    with tarfile.open(path, "w") as tar:
        data = pickle.dumps({"protocol_version": 1000})
        info = tarfile.TarInfo("sys_info")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def _zip(path: Path, names: list[str]) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        for name in names:
            archive.writestr(name, b"x")


NOT_CHECKPOINTS: dict[str, tuple[Callable[[Path], None], type[CkptfsError], str]] = {
    "empty": (lambda p: p.write_bytes(b""), NotACheckpointError, "empty file"),
    "random": (lambda p: p.write_bytes(bytes(range(7, 200))), NotACheckpointError,
               "not a PyTorch checkpoint \\(starts with bytes 07 08 09 0a 0b 0c 0d 0e\\)"),
    "text": (lambda p: p.write_text("hello\n"), NotACheckpointError, "not a PyTorch checkpoint"),
    "safetensors": (_safetensors, NotACheckpointError, "a safetensors file"),
    "numpy": (lambda p: p.write_bytes(_npy()), NotACheckpointError, "a numpy .npy file"),
    "gguf": (lambda p: p.write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(64)), NotACheckpointError, "a GGUF file"),
    "hdf5": (lambda p: p.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(64)), NotACheckpointError, "an HDF5 file"),
    "pickle_protocol_2": (lambda p: p.write_bytes(pickle.dumps({"a": 1}, protocol=2)), NotACheckpointError,
                          "a pickle file, but not a torch.save checkpoint"),
    "pickle_protocol_5": (lambda p: p.write_bytes(pickle.dumps([1, 2], protocol=5)), NotACheckpointError,
                          "a pickle file, but not a torch.save checkpoint"),
    "pickle_protocol_0": (lambda p: p.write_bytes(pickle.dumps({"a": 1}, protocol=0)), NotACheckpointError,
                          "not a PyTorch checkpoint"),
    "tar": (_tar, UnsupportedError, "a tar archive"),
    "preview": (lambda p: p.write_bytes(b"PYTORCH1" + bytes(32)), UnsupportedError, "PYTORCH1"),
    "empty_zip": (lambda p: _zip(p, []), NotACheckpointError, "an empty zip archive"),
    "zip_without_pickle": (lambda p: _zip(p, ["model/weights.bin"]), NotACheckpointError,
                           "zip archive without model/data.pkl"),
    "zip_without_prefix": (lambda p: _zip(p, ["data.pkl"]), CorruptCheckpointError,
                           "zip record 'data.pkl' is not inside an archive directory"),
    "zip_mixed_prefixes": (lambda p: _zip(p, ["a/data.pkl", "b/version"]), CorruptCheckpointError,
                           "zip record 'b/version' is outside the archive directory 'a/'"),
    "torch_export": (lambda p: write_raw_archive(p, b"\x80\x02N.", {"archive_format": b"pt2"}), UnsupportedError,
                     "torch.export"),
    "directory": (lambda p: p.mkdir(), SourceError, "a directory, not a checkpoint file"),
    "missing": (lambda p: None, SourceError, "cannot open: No such file or directory"),
}


@pytest.mark.parametrize("kind", NOT_CHECKPOINTS)
def test_not_a_checkpoint(tmp_path: Path, kind: str) -> None:
    make, error, reason = NOT_CHECKPOINTS[kind]
    path = tmp_path / f"{kind}.pt"
    make(path)
    with pytest.raises(error, match=reason) as info:
        ckptfs.open(path)
    assert type(info.value) is error
    assert str(info.value).startswith(f"{path}: ")
    assert info.value.path == str(path)


def test_detection_ignores_the_file_name(tmp_path: Path, corpus: dict[str, CorpusFile]) -> None:
    for name, fmt in (("r1_views_containers", "zip"), ("r3_legacy", "legacy"), ("r5_traced", "torchscript")):
        disguised = tmp_path / f"{name}.safetensors"
        shutil.copy(corpus[name].path, disguised)
        with ckptfs.open(disguised) as ck:
            assert ck.format == fmt and len(ck.tensors) == corpus[name].expected.distinct


def test_checkpoint_embedded_in_bytes(corpus: dict[str, CorpusFile]) -> None:
    data = corpus["r1_views_containers"].path.read_bytes()
    with ckptfs.open(ckptfs.sources.BytesSource(data, "in-memory")) as ck:
        assert ck.path == "in-memory"
        assert ck.read(ck.tensor(("row_view",))) == torch.arange(12.0, 18.0).numpy().tobytes()


# -- broken zip checkpoints --------------------------------------------------------------


@pytest.fixture
def small_zip(tmp_path: Path) -> Path:
    return save_zip({"t": torch.arange(4.0)}, tmp_path / "small.pt")


def _zip_records(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as archive:
        return {name.split("/", 1)[1]: archive.read(name) for name in archive.namelist()}


def test_zip_without_its_tail(small_zip: Path) -> None:
    data = small_zip.read_bytes()
    small_zip.write_bytes(data[: len(data) - 30])
    with pytest.raises(CorruptCheckpointError, match="no zip end-of-central-directory record"):
        ckptfs.open(small_zip)


def test_storage_record_of_the_wrong_size(tmp_path: Path, small_zip: Path) -> None:
    records = _zip_records(small_zip)
    path = write_raw_archive(tmp_path / "short.pt", records["data.pkl"], {"data/0": bytes(6)})
    with pytest.raises(CorruptCheckpointError, match="record 'data/0' holds 6 bytes but its storage declares 16"):
        ckptfs.open(path)


def test_missing_storage_record(tmp_path: Path, small_zip: Path) -> None:
    path = write_raw_archive(tmp_path / "missing.pt", _zip_records(small_zip)["data.pkl"])
    with pytest.raises(CorruptCheckpointError, match="storage record 'data/0' is missing from the archive"):
        ckptfs.open(path)


def test_duplicate_record_names(tmp_path: Path) -> None:
    path = tmp_path / "dup.pt"
    with pytest.warns(UserWarning, match="Duplicate name"), zipfile.ZipFile(path, "w") as archive:
        archive.writestr("dup/data.pkl", pickle.dumps(None, protocol=2))
        archive.writestr("dup/data.pkl", pickle.dumps(1, protocol=2))
    with pytest.raises(CorruptCheckpointError, match="duplicate zip record 'dup/data.pkl'"):
        ckptfs.open(path)

