"""Format detection by content: every file that is not a checkpoint fails with the right error, naming the file."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import pickle
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import warnings
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch
from corpus import CorpusFile, save_zip, write_raw_archive

import ckptfs
from ckptfs.errors import CkptfsError, CorruptCheckpointError, NotACheckpointError, SourceError, UnsupportedError

CLI = [sys.executable, "-m", "ckptfs.cli"]


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


ZSTD_EMPTY_FRAME = bytes.fromhex("28b52ffd2000010000")
"""``zstd`` of nothing (python 3.11 has no zstd module): its magic number starts any zstd file."""


def _checkpoint_bytes() -> bytes:
    out = io.BytesIO()
    torch.save({"w": torch.arange(4.0)}, out)
    return out.getvalue()


def _directory_of_files(path: Path) -> None:
    path.mkdir()
    (path / "model.pt").write_bytes(_checkpoint_bytes())
    (path / ".metadata").write_bytes(pickle.dumps({"not": "dcp"}, protocol=4))


def _zip(path: Path, names: list[str]) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        for name in names:
            archive.writestr(name, b"x")


NOT_CHECKPOINTS: dict[str, tuple[Callable[[Path], None], type[CkptfsError], str]] = {
    "empty": (lambda p: p.write_bytes(b""), NotACheckpointError, "empty file"),
    "random": (lambda p: p.write_bytes(bytes(range(7, 200))), NotACheckpointError,
               "not a PyTorch checkpoint \\(starts with bytes 07 08 09 0a 0b 0c 0d 0e\\)"),
    "text": (lambda p: p.write_text("hello\n"), NotACheckpointError, "not a PyTorch checkpoint"),
    "numpy": (lambda p: p.write_bytes(_npy()), NotACheckpointError, "a numpy .npy file"),
    "gguf": (lambda p: p.write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(64)), NotACheckpointError, "a GGUF file"),
    "hdf5": (lambda p: p.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(64)), NotACheckpointError, "an HDF5 file"),
    **{f"pickle_protocol_{protocol}": (lambda p, n=protocol: p.write_bytes(pickle.dumps({"a": [1, 2]}, n)),
                                       NotACheckpointError, "^a pickle file, but not a torch.save checkpoint")
       for protocol in range(6)},
    "pickle_protocol_0_of_a_long_object": (lambda p: p.write_bytes(pickle.dumps(list(range(30_000)), 0)),
                                           NotACheckpointError, "^a pickle file, but not a torch.save checkpoint"),
    "text_that_begins_like_a_pickle": (lambda p: p.write_text("I am not a pickle\n"), NotACheckpointError,
                                       "^not a PyTorch checkpoint \\(starts with bytes 49 20 61 6d"),
    "gzip": (lambda p: p.write_bytes(gzip.compress(_checkpoint_bytes())), NotACheckpointError,
             "^gzip-compressed; decompress it first$"),
    "bzip2": (lambda p: p.write_bytes(bz2.compress(_checkpoint_bytes())), NotACheckpointError,
              "^bzip2-compressed; decompress it first$"),
    "xz": (lambda p: p.write_bytes(lzma.compress(_checkpoint_bytes())), NotACheckpointError,
           "^xz-compressed; decompress it first$"),
    "zstd": (lambda p: p.write_bytes(ZSTD_EMPTY_FRAME), NotACheckpointError, "^zstd-compressed; decompress it first$"),
    "plain_zip": (lambda p: _zip(p, ["README.txt", "docs/a.txt"]), NotACheckpointError,
                  "^a zip archive, but not a torch.save checkpoint \\(no data.pkl\\)$"),
    "tar": (_tar, NotACheckpointError, "^a tar archive, but not a torch ≤ 0.3 checkpoint \\(no 'storages' member\\)$"),
    "preview": (lambda p: p.write_bytes(b"PYTORCH1" + bytes(32)), UnsupportedError, "PYTORCH1"),
    "empty_zip": (lambda p: _zip(p, []), NotACheckpointError, "an empty zip archive"),
    "zip_without_pickle": (lambda p: _zip(p, ["model/weights.bin"]), NotACheckpointError,
                           "^a zip archive, but not a torch.save checkpoint \\(no data.pkl\\)$"),
    "zip_with_a_deeper_pickle": (lambda p: _zip(p, ["model/sub/data.pkl"]), NotACheckpointError,
                                 "^a zip archive, but not a torch.save checkpoint \\(no data.pkl\\)$"),
    "zip_without_prefix": (lambda p: _zip(p, ["data.pkl"]), CorruptCheckpointError,
                           "zip record 'data.pkl' is not inside an archive directory"),
    "zip_mixed_prefixes": (lambda p: _zip(p, ["a/data.pkl", "b/version"]), CorruptCheckpointError,
                           "zip record 'b/version' is outside the archive directory 'a/'"),
    "torch_export": (lambda p: write_raw_archive(p, b"\x80\x02N.", {"archive_format": b"pt2"}),
                     CorruptCheckpointError, "^a torch.export archive without any models/<name>.json$"),
    "directory": (lambda p: p.mkdir(), NotACheckpointError, "^a directory, but no checkpoint directory: "),
    "directory_of_files": (_directory_of_files, NotACheckpointError, "^a directory, but no checkpoint directory: "),
    "missing": (lambda p: None, SourceError, "cannot open: No such file or directory"),
}


@pytest.mark.parametrize("kind", NOT_CHECKPOINTS)
def test_not_a_checkpoint(tmp_path: Path, kind: str) -> None:
    make, error, reason = NOT_CHECKPOINTS[kind]
    path = tmp_path / f"{kind}.pt"
    make(path)
    with pytest.raises(error) as info:
        ckptfs.open(path)
    assert re.search(reason, info.value.reason), info.value.reason
    assert type(info.value) is error
    assert str(info.value).startswith(f"{path}: ")
    assert info.value.path == str(path)


@pytest.mark.parametrize("kind", NOT_CHECKPOINTS)
def test_ls_says_it_in_one_line(tmp_path: Path, kind: str) -> None:
    make, _, reason = NOT_CHECKPOINTS[kind]
    path = tmp_path / f"{kind}.pt"
    make(path)
    _assert_ls_fails(path, reason)


def _assert_ls_fails(path: Path, reason: str) -> None:
    result = subprocess.run([*CLI, "ls", str(path)], capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout) == (1, ""), result
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(f"ckptfs: {path}: "), result.stderr
    assert re.search(reason, result.stderr[len(f"ckptfs: {path}: ") : -1]), result.stderr


# -- torch.distributed.checkpoint, written by torch ------------------------------------------------------


@pytest.fixture(scope="module")
def dcp_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """DCP directories of a nested state dict (one .distcp of several items), with and without collectives; a
    copy with every file renamed; and one of a single tensor, whose .distcp is one torch.save archive."""
    import torch.distributed.checkpoint as dcp

    base = tmp_path_factory.mktemp("dcp")
    state = {"w": torch.arange(6.0).reshape(2, 3), "step": 7, "nested": {"b": torch.ones(2, dtype=torch.int16)}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=base / "dcp", no_dist=True)
        dcp.save(state, checkpoint_id=base / "per_rank", no_dist=True, use_collectives=False)
        dcp.save({"w": state["w"]}, checkpoint_id=base / "one_item", no_dist=True)
    renamed = base / "renamed"
    renamed.mkdir()
    for n, file in enumerate(sorted((base / "dcp").iterdir())):
        shutil.copy(file, renamed / f"part{n}.bin")
    assert sorted(p.name for p in (base / "dcp").iterdir()) == [".metadata", "__0_0.distcp"]
    assert sorted(p.name for p in (base / "per_rank").iterdir()) == ["__0.metadata", "__0_0.distcp"]
    return {"dcp": base / "dcp", "per_rank": base / "per_rank", "renamed": renamed, "one_item": base / "one_item"}


@pytest.mark.parametrize("kind", ["dcp", "per_rank", "renamed"])
def test_a_dcp_directory_is_recognised_by_content(dcp_files: dict[str, Path], kind: str) -> None:
    """Renamed files too: the metadata pickle is found by its first global, not by its name."""
    if kind == "renamed":
        for file in dcp_files["renamed"].iterdir():  # chunks name their files: only the metadata may be renamed
            if file.name == "part1.bin":
                file.rename(file.with_name("__0_0.distcp"))
    with ckptfs.open(dcp_files[kind]) as ck:
        assert ck.format == "dcp" and ck.root["step"] == 7
        assert ck.read(ck.tensor(("nested", "b"))) == torch.ones(2, dtype=torch.int16).numpy().tobytes()
        assert ck.read(ck.tensor(("w",))) == torch.arange(6.0).numpy().tobytes()
    if kind == "renamed":
        (dcp_files["renamed"] / "__0_0.distcp").rename(dcp_files["renamed"] / "part1.bin")


DCP_CASES: dict[str, tuple[Callable[[dict[str, Path]], Path], type[CkptfsError], str]] = {
    "distcp": (lambda d: d["dcp"] / "__0_0.distcp", NotACheckpointError,
               "^a single .distcp file of a torch.distributed.checkpoint directory: mount the directory$"),
    "distcp_renamed": (lambda d: d["renamed"] / "part1.bin", NotACheckpointError,
                       "^a single .distcp file of a torch.distributed.checkpoint directory: mount the directory$"),
    "metadata": (lambda d: d["dcp"] / ".metadata", UnsupportedError,
                 "^the .metadata file of a torch.distributed.checkpoint directory: mount the directory$"),
    "per_rank_metadata": (lambda d: d["per_rank"] / "__0.metadata", UnsupportedError,
                          "^the .metadata file of a torch.distributed.checkpoint directory"),
}


@pytest.mark.parametrize("kind", DCP_CASES)
def test_dcp_is_named(dcp_files: dict[str, Path], kind: str) -> None:
    which, error, reason = DCP_CASES[kind]
    path = which(dcp_files)
    with pytest.raises(CkptfsError) as info:
        ckptfs.open(path)
    assert type(info.value) is error and info.value.path == str(path)
    assert re.search(reason, info.value.reason), info.value.reason
    _assert_ls_fails(path, reason)


def test_a_distcp_of_one_item_is_that_tensors_archive(dcp_files: dict[str, Path]) -> None:
    with ckptfs.open(dcp_files["one_item"] / "__0_0.distcp") as ck:
        assert ck.read(ck.tensor(())) == torch.arange(6.0).numpy().tobytes()


@pytest.mark.parametrize("protocol", [1, 2])
def test_legacy_checkpoint_of_any_protocol_torch_loads(tmp_path: Path, protocol: int) -> None:
    """Protocol 1 legacy files have no PROTO opcode: recognised by their first pickle, the magic number."""
    obj = {"w": torch.arange(6.0).reshape(2, 3).t(), "step": 3}
    path = tmp_path / f"legacy{protocol}.pt"
    torch.save(obj, path, _use_new_zipfile_serialization=False, pickle_protocol=protocol)
    assert torch.equal(torch.load(path, weights_only=False)["w"], obj["w"])
    with ckptfs.open(path) as ck:
        assert ck.format == "legacy" and ck.root["step"] == 3
        assert ck.read(ck.tensor(("w",))) == obj["w"].contiguous().numpy().tobytes()


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

