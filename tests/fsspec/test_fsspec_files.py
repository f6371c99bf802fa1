"""The ``ckpt`` fsspec file system against torch: every corpus tensor through ls, info, cat_file ranges and open."""

from __future__ import annotations

import errno
import io
import json
import pickle
import random
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
import torch
from corpus import CORPUS_NAMES, CorpusFile, torch_bytes
from counting import CountingSource
from index_files import file_of_path

from ckptfs.errors import CkptfsError
from ckptfs.fsspec import CheckpointFileSystem
from ckptfs.model.encoding import encode_key
from ckptfs.sources import LocalFileSource


def file_of(fs: CheckpointFileSystem, path: tuple[Any, ...]) -> str:
    index = json.loads(fs.cat_file(".ckptfs/index.json"))
    return file_of_path(index, [encode_key(key) for key in path])


def test_the_entry_point_registers_the_ckpt_protocol() -> None:
    assert "ckpt" in fsspec.available_protocols()
    assert fsspec.get_filesystem_class("ckpt") is CheckpointFileSystem


@pytest.mark.parametrize("name", CORPUS_NAMES)
def test_every_tensor_reads_as_torch_wrote_it(corpus: dict[str, CorpusFile], name: str) -> None:
    entry = corpus[name]
    fs = fsspec.filesystem("ckpt", fo=str(entry.path))
    rng = random.Random(name)
    for path, t in entry.expected.tensors.items():
        if t.is_meta:
            continue
        expected = torch_bytes(t)
        file = file_of(fs, path)
        assert fs.info(file)["size"] == len(expected), file
        assert fs.cat_file(file) == expected, file
        start = rng.randrange(len(expected) + 1)
        end = rng.randrange(start, len(expected) + 1)
        assert fs.cat_file(file, start, end) == expected[start:end], file
        assert fs.cat_file(file, -3) == expected[-3:]
        with fs.open(file, block_size=7) as f:
            assert f.size == len(expected)
            f.seek(start)
            assert f.read(5) + f.read() == expected[start:]


def test_info_of_a_tensor_gives_its_dtype_and_shape(corpus: dict[str, CorpusFile]) -> None:
    fs = CheckpointFileSystem(fo=corpus["r1_views_containers"].path)
    assert fs.info("transposed") == {"name": "transposed", "size": 96, "type": "file", "kind": "tensor",
                                     "dtype": "float32", "shape": [6, 4]}
    assert fs.info("nested") == {"name": "nested", "size": 0, "type": "directory", "kind": "dir"}
    assert fs.info("transposed.json")["type"] == "file"
    sidecar = json.loads(fs.cat_file("transposed.json"))
    assert (sidecar["dtype"], sidecar["shape"]) == ("float32", [6, 4])
    assert fs.cat_file("leaves/text") == "ünïcode\n".encode()


def test_tied_weights_are_links_that_read_as_their_target(corpus: dict[str, CorpusFile]) -> None:
    entry = corpus["r1_views_containers"]
    fs = CheckpointFileSystem(fo=entry.path)
    shared = torch_bytes(entry.expected.tensors[("alias_a",)])
    assert fs.info("alias_b") == {"name": "alias_b", "size": 6, "type": "file", "kind": "link", "islink": True,
                                  "destination": "alias_a"}
    assert fs.info("alias_b.json")["destination"] == "alias_a.json"
    assert fs.cat_file("alias_b") == fs.cat_file("alias_a") == shared
    assert fs.open("alias_b").read() == shared


def test_a_shared_directory_is_a_link_that_lists_its_target_and_finds_visit_once(tmp_path: Path) -> None:
    block = {"w": torch.arange(4, dtype=torch.int32)}
    torch.save({"a": block, "b": block}, tmp_path / "m.pt")
    fs = CheckpointFileSystem(fo=str(tmp_path / "m.pt"))
    assert fs.info("b") == {"name": "b", "size": 0, "type": "link", "kind": "link", "islink": True,
                            "destination": "a"}
    assert fs.ls("b", detail=False) == ["b/w", "b/w.json", "b/w.npy", "b/model.safetensors"]
    assert fs.cat_file("b/w") == torch_bytes(block["w"])
    assert fs.find("") == [".ckptfs/index.json", "a/model.safetensors", "a/w", "a/w.json", "a/w.npy", "b",
                           "model.safetensors"]


def test_ls_of_a_file_is_its_info_and_missing_paths_are_not_found(corpus: dict[str, CorpusFile]) -> None:
    fs = CheckpointFileSystem(fo=corpus["r9_protocol4"].path)
    assert fs.ls("base") == [fs.info("base")]
    assert fs.isdir("ints") and fs.isfile("ints/0") and not fs.exists("ints/9")
    with pytest.raises(FileNotFoundError):
        fs.info("no such tensor")
    with pytest.raises(FileNotFoundError):
        fs.cat_file("ints/9")
    with pytest.raises(NotADirectoryError):
        fs.info("base/below")
    with pytest.raises(IsADirectoryError):
        fs.cat_file("ints")
    with pytest.raises(OSError) as caught:
        fs.open("base", "wb")
    assert caught.value.errno == errno.EROFS


def test_chained_urls_read_local_and_other_file_systems(corpus: dict[str, CorpusFile]) -> None:
    entry = corpus["r9_protocol4"]
    expected = torch_bytes(entry.expected.tensors[("base",)])
    with fsspec.open(f"ckpt://base::{entry.path}") as f:
        assert f.read() == expected
    with fsspec.open(f"ckpt://base::file://{entry.path}") as f:
        assert f.read() == expected
    memory = fsspec.filesystem("memory")
    memory.pipe_file("/ckpt-test/model.pt", entry.path.read_bytes())
    try:
        with fsspec.open("ckpt://ints/0::memory://ckpt-test/model.pt") as f:
            assert f.read() == torch_bytes(entry.expected.tensors[("ints", 0)])
        fs, path = fsspec.core.url_to_fs("ckpt://half::memory://ckpt-test/model.pt")
        assert fs.cat_file(path, 2, 6) == torch_bytes(entry.expected.tensors[("half",)])[2:6]
    finally:
        memory.rm("/ckpt-test", recursive=True)


def test_an_open_file_object_and_a_byte_source_serve_as_fo(corpus: dict[str, CorpusFile]) -> None:
    entry = corpus["r9_protocol4"]
    expected = torch_bytes(entry.expected.tensors[("base",)])
    with open(entry.path, "rb") as f:
        assert CheckpointFileSystem(fo=f).cat_file("base") == expected
    assert CheckpointFileSystem(fo=LocalFileSource(entry.path)).cat_file("base", 4, 8) == expected[4:8]


def test_reads_are_lazy_ranges_of_the_source(tmp_path: Path) -> None:
    torch.save({"big": torch.zeros(1 << 20), "small": torch.ones(3)}, tmp_path / "m.pt")
    source = CountingSource(LocalFileSource(tmp_path / "m.pt"))
    fs = CheckpointFileSystem(fo=source)
    fs.ls("")
    source.reads.clear()
    with fs.open("big", block_size=4096) as f:
        f.seek(1 << 21)
        assert f.read(10) == bytes(10)
    assert sum(length for _, length in source.reads) <= 10 + 4096 + 512  # what was asked, a block ahead, framing
    source.reads.clear()
    assert fs.cat_file("big", 100, 108) == bytes(8)
    assert [length for _, length in source.reads] == [8]


def test_a_file_system_pickles_for_workers(corpus: dict[str, CorpusFile]) -> None:
    entry = corpus["r9_protocol4"]
    fs = fsspec.filesystem("ckpt", fo=str(entry.path))
    again = pickle.loads(pickle.dumps(fs))
    assert again.cat_file("base") == fs.cat_file("base") == torch_bytes(entry.expected.tensors[("base",)])


def test_what_is_not_a_checkpoint_fails_with_a_ckptfs_error(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(CkptfsError, match="notes.txt"):
        fsspec.filesystem("ckpt", fo=str(tmp_path / "notes.txt"))


def test_a_container_holding_itself_is_walked_once(tmp_path: Path) -> None:
    """``[t, <the list itself>]``: the inner list is a link to the root, so find and walk end."""
    from corpus import write_raw_archive

    path = write_raw_archive(tmp_path / "cycle.pt", b"\x80\x02]q\x00h\x00a.")
    fs = CheckpointFileSystem(fo=str(path))
    assert fs.info("0") == {"name": "0", "size": 0, "type": "link", "kind": "link", "islink": True,
                            "destination": ""}
    assert fs.find("") == [".ckptfs/index.json", "0"]
    assert fs.ls("0/0/0", detail=False) == ["0/0/0/.ckptfs", "0/0/0/0"]  # the root, as through the mount


def test_views_storage_option_chooses_the_files_beside_the_tensors(tmp_path: Path) -> None:
    w = torch.arange(6.0)
    torch.save({"w": w}, tmp_path / "v.pt")
    url = f"ckpt://w.npy::file://{tmp_path / 'v.pt'}"
    with fsspec.open(url, "rb", ckpt={"views": "npy"}) as f:
        assert np.array_equal(np.load(io.BytesIO(f.read())), w.numpy())
    fs = CheckpointFileSystem(fo=str(tmp_path / "v.pt"), views="npy")
    assert fs.ls("", detail=False) == [".ckptfs", "w", "w.npy"]
    assert CheckpointFileSystem(fo=str(tmp_path / "v.pt"), views=[]).ls("", detail=False) == [".ckptfs", "w"]
    with pytest.raises(CkptfsError, match="unknown view 'yaml'"):
        CheckpointFileSystem(fo=str(tmp_path / "v.pt"), views="json,yaml")
