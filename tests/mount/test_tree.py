"""What a real mount shows: names, sidecars, the index, values, links, attributes; find and ls terminate."""

from __future__ import annotations

import errno
import json
import os
import pickle
import stat
import subprocess
import warnings
from pathlib import Path

import pytest
import torch
from corpus import CORPUS_NAMES, CorpusFile, save_legacy, save_zip, torch_bytes, write_raw_archive
from hostile.containers import zip_checkpoint
from index_files import files_by_id
from shapes import LS_LA, dag_bomb, long_paths, omegaconf_like

import ckptfs
from ckptfs.fs.describe import tensor_metadata
from ckptfs.fs.names import entry_name
from ckptfs.model.encoding import encode_key
from mount.helpers import Mounter

pytestmark = pytest.mark.mount

AWKWARD_KEYS: list[object] = ["a/b", ".", "..", "", ".hidden", "w", "w.json", "7", 7, "x" * 300, "é/ü", "\n",
                              "model.safetensors", "100%"]
AWKWARD_NAMES = {"a/b": "a%2Fb", ".": "%2E", "..": "%2E.", "": '%=""', ".hidden": "%2Ehidden", "w.json": "w%2Ejson",
                 "7": "%37", 7: "7", "\n": "%0A", "model.safetensors": "model%2Esafetensors", "100%": "100%25"}
"""The names the README's rules give (str ``'7'`` is escaped: int ``7`` is beside it)."""


def walk_files(mnt: Path) -> set[str]:
    out = subprocess.run(["find", str(mnt)], capture_output=True, text=True, check=True, timeout=60).stdout
    return {line[len(str(mnt)) + 1 :] for line in out.splitlines()[1:]}


@pytest.mark.parametrize("name", CORPUS_NAMES)
def test_find_and_ls_list_every_tensor(corpus: dict[str, CorpusFile], corpus_mounts: dict[str, Path],
                                       name: str) -> None:
    mnt = corpus_mounts[name]
    index = json.loads((mnt / ".ckptfs" / "index.json").read_text())
    listed = walk_files(mnt)
    files = [t["file"] for t in index["tensors"]]
    assert len(files) == len({id(t) for t in corpus[name].expected.tensors.values()})
    assert set(files) <= listed and {t["sidecar"] for t in index["tensors"]} <= listed
    ls = subprocess.run(["ls", "-lR", str(mnt)], capture_output=True, text=True, check=True, timeout=60).stdout
    listed = {line.split(None, 8)[-1] for line in ls.splitlines() if line.count(" ") >= 8}
    assert {os.path.basename(f) for f in files} <= listed


@pytest.mark.parametrize("name", CORPUS_NAMES)
def test_sidecars_and_index(corpus: dict[str, CorpusFile], corpus_mounts: dict[str, Path], name: str) -> None:
    mnt = corpus_mounts[name]
    index = json.loads((mnt / ".ckptfs" / "index.json").read_text())
    with ckptfs.open(corpus[name].path) as ck:
        assert [t["path"] for t in index["tensors"]] == [[encode_key(k) for k in t.path] for t in ck.tensors]
        for listed, tensor in zip(index["tensors"], ck.tensors):
            assert json.loads((mnt / listed["sidecar"]).read_text()) == json.loads(
                json.dumps(tensor_metadata(tensor)))
            assert (mnt / listed["file"]).stat().st_size == tensor.nbytes
    files = files_by_id(index)
    for entry in index["entries"]:
        target = mnt / files[entry["id"]]
        if entry["kind"] == "value":
            assert target.is_file() and not target.is_symlink()
        elif entry["kind"] == "link":
            assert target.is_symlink() and target.resolve() == (mnt / files[entry["target"]]).resolve()
        else:
            assert target.is_dir() and not target.is_symlink()


def test_values_links_and_awkward_keys(tmp_path: Path, mounter: Mounter) -> None:
    shared = torch.arange(5, dtype=torch.int16)
    tensors = {key: torch.full((2,), float(i)) for i, key in enumerate(AWKWARD_KEYS)}
    obj = {"epoch": 3, "lr": 0.001, "name": "run/1", "flag": None, "keys": tensors, "a": shared, "b": shared,
           "nested": {"again": shared}, "blob": b"\x00\xff"}
    for path in (save_zip(obj, tmp_path / "z.pt"), save_legacy(obj, tmp_path / "l.pt")):
        mnt = mounter(path)
        assert subprocess.run(["cat", str(mnt / "epoch")], capture_output=True, check=True).stdout == b"3\n"
        assert (mnt / "lr").read_text() == "0.001\n" and (mnt / "name").read_text() == "run/1\n"
        assert (mnt / "flag").read_text() == "None\n" and (mnt / "blob").read_bytes() == b"\x00\xff"
        assert os.readlink(mnt / "b") == "a" and os.readlink(mnt / "nested" / "again") == "../a"
        assert os.readlink(mnt / "b.json") == "a.json"
        assert (mnt / "b").read_bytes() == torch_bytes(shared)
        names = os.listdir(mnt / "keys")
        assert len(names) == 3 * len(AWKWARD_KEYS) + 1  # each tensor, its sidecar and .npy; model.safetensors
        index = json.loads((mnt / ".ckptfs" / "index.json").read_text())
        files = {tuple(t["path"]): t["file"] for t in index["tensors"]}
        for key, t in tensors.items():
            file = files[("keys", encode_key(key))]
            assert file == "keys/" + AWKWARD_NAMES.get(key, entry_name(key))  # type: ignore[call-overload]
            assert (mnt / file).read_bytes() == torch_bytes(t)


class _Stack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
        self.heads = torch.nn.ModuleList([torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.encoder(x)
        out = x[:, :1]
        for head in self.heads:
            out = out + head(x)
        return out


def test_torchscript_sequential_children_are_named_by_their_keys(tmp_path: Path, mounter: Mounter) -> None:
    """nn.Sequential and nn.ModuleList children are attributes ``'0'``, ``'1'`` …: files ``encoder/0/weight``."""
    module = _Stack()
    path = tmp_path / "stack.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.save(torch.jit.script(module), str(path))
    mnt = mounter(path)
    assert {"0", "1", "2"} <= set(os.listdir(mnt / "encoder")) and {"0", "1"} <= set(os.listdir(mnt / "heads"))
    listed = walk_files(mnt)
    for name, tensor in module.state_dict().items():
        file = name.replace(".", "/")
        assert file in listed and file + ".json" in listed
        assert (mnt / file).read_bytes() == torch_bytes(tensor)
        assert json.loads((mnt / (file + ".json")).read_text())["path"] == name.split(".")
    index = json.loads((mnt / ".ckptfs" / "index.json").read_text())
    assert {tuple(t["path"]): t["file"] for t in index["tensors"]} == {
        tuple(name.split(".")): name.replace(".", "/") for name in module.state_dict()}
    ls = subprocess.run(["ls", str(mnt / "encoder" / "0")], capture_output=True, text=True, check=True).stdout
    assert ls.split() == sorted(["bias", "bias.json", "bias.npy", "weight", "weight.json", "weight.npy", "training",
                                 "_is_full_backward_hook"])


def test_str_and_int_keys_spelling_one_number(tmp_path: Path, mounter: Mounter) -> None:
    """A dict with both ``'7'`` and ``7``: int 7 is ``7``, str ``'7'`` is ``%37``; a lone ``'0'`` is ``0``."""
    seven, str_seven, zero = torch.arange(3.0), torch.arange(4, dtype=torch.int16), torch.ones(2)
    path = save_zip({"7": str_seven, 7: seven, "0": zero, "8": "eight", "again": [str_seven, zero]},
                    tmp_path / "sevens.pt")
    mnt = mounter(path)
    assert sorted(os.listdir(mnt)) == sorted([".ckptfs", "%37", "%37.json", "%37.npy", "7", "7.json", "7.npy", "0",
                                              "0.json", "0.npy", "8", "again", "model.safetensors"])
    assert [os.readlink(mnt / "again" / name) for name in ("0", "0.json", "1", "1.json")] == [
        "../%37", "../%37.json", "../0", "../0.json"]
    assert (mnt / "again" / "0").read_bytes() == torch_bytes(str_seven)
    assert inode_numbers(mounter(path)) == inode_numbers(mnt)
    assert (mnt / "7").read_bytes() == torch_bytes(seven) and (mnt / "%37").read_bytes() == torch_bytes(str_seven)
    assert (mnt / "0").read_bytes() == torch_bytes(zero) and (mnt / "8").read_text() == "eight\n"
    assert json.loads((mnt / "7.json").read_text())["path"] == [7]
    assert json.loads((mnt / "%37.json").read_text())["path"] == ["7"]
    index = json.loads((mnt / ".ckptfs" / "index.json").read_text())
    assert [(t["path"], t["file"]) for t in index["tensors"]] == [(["7"], "%37"), ([7], "7"), (["0"], "0")]
    assert [(e["key"], e["name"]) for e in index["entries"][1:]] == [("8", "8"), ("again", "again"), (0, "0"),
                                                                      (1, "1")]


def test_inert_object_shows_its_command(tmp_path: Path, mounter: Mounter) -> None:
    """``os.system('ls -la')`` pickled (a REDUCE of ``posix.system``): its argument is a value file, never run."""
    path = tmp_path / "system.pt"
    path.write_bytes(zip_checkpoint(LS_LA))
    mnt = mounter(path)
    listed = subprocess.run(["ls", "-la", str(mnt)], capture_output=True, text=True, check=True).stdout
    assert listed.splitlines()[-1].split()[-1] == "__args__"
    assert os.listdir(mnt / "__args__") == ["0"]
    assert subprocess.run(["cat", str(mnt / "__args__" / "0")], capture_output=True, check=True).stdout == b"ls -la\n"
    index = json.loads((mnt / ".ckptfs" / "index.json").read_text())
    assert index["entries"] == [
        {"id": 0, "name": "", "kind": "object", "class": "posix.system"},
        {"id": 1, "parent": 0, "name": "__args__", "key": "__args__", "kind": "tuple"},
        {"id": 2, "parent": 1, "name": "0", "key": 0, "kind": "value", "size": 7, "value": "ls -la"}]


def test_omegaconf_like_config_keeps_its_values(fake_omegaconf: dict[str, type], tmp_path: Path,
                                                mounter: Mounter) -> None:
    path = tmp_path / "config.pt"
    path.write_bytes(zip_checkpoint(pickle.dumps({"cfg": omegaconf_like(fake_omegaconf)}, protocol=2)))
    content = mounter(path) / "cfg" / "_content"
    assert sorted(os.listdir(content)) == ["budget", "color", "lr", "name"]
    assert (content / "lr" / "_val").read_text() == "0.001\n"
    assert (content / "name" / "_val").read_text() == "run-7\n"
    assert (content / "color" / "_val" / "__args__" / "0").read_text() == "red\n"
    assert (content / "budget" / "_val" / "__args__" / "0").read_text() == "0.1\n"
    assert (content / "color" / "_metadata" / "key").read_text() == "color\n"
    assert json.loads((content / "color" / "_metadata" / "ref_type").read_text()) == {"$global": "myapp.config.Color"}


def test_shared_reference_bomb(tmp_path: Path, mounter: Mounter) -> None:
    mnt = mounter(write_raw_archive(tmp_path / "bomb.pt", dag_bomb(40), {"data/0": b"\0" * 8}))
    listed = walk_files(mnt)
    assert "/".join(["0"] * 41) in listed and len(listed) < 200
    subprocess.run(["ls", "-lR", str(mnt)], capture_output=True, check=True, timeout=60)
    subprocess.run(["du", "-s", str(mnt)], capture_output=True, check=True, timeout=60)


def test_attributes_follow_the_source(tmp_path: Path, mounter: Mounter) -> None:
    source = save_zip({"m": {"w": torch.ones(3, 4)}, "step": 7}, tmp_path / "s.pt")
    os.chmod(source, 0o640)
    os.utime(source, ns=(1_600_000_000_123_456_789, 1_700_000_000_987_654_321))
    src = os.stat(source)
    mnt = mounter(source)
    for path, mode in ((mnt, 0o550), (mnt / "m", 0o550), (mnt / "m" / "w", 0o440), (mnt / "m" / "w.json", 0o440),
                       (mnt / "step", 0o440), (mnt / ".ckptfs" / "index.json", 0o440)):
        st = os.stat(path)
        assert stat.S_IMODE(st.st_mode) == mode, path
        assert (st.st_uid, st.st_gid) == (src.st_uid, src.st_gid)
        assert (st.st_mtime_ns, st.st_ctime_ns) == (src.st_mtime_ns, src.st_ctime_ns)
    st = os.stat(mnt / "m" / "w")
    assert st.st_size == 48 and st.st_blksize == 1 << 20 and st.st_nlink == 1


def inode_numbers(mnt: Path) -> dict[str, int]:
    found = {}
    for directory, dirs, files in os.walk(mnt):
        for name in dirs + files:
            path = os.path.join(directory, name)
            found[os.path.relpath(path, mnt)] = os.lstat(path).st_ino
    return found


def test_inode_numbers_are_stable(corpus: dict[str, CorpusFile], mounter: Mounter) -> None:
    first = inode_numbers(mounter(corpus["r1_views_containers"].path))
    assert len(set(first.values())) == len(first)
    assert inode_numbers(mounter(corpus["r1_views_containers"].path)) == first


def test_generated_files_over_the_limit_read_as_io_errors(tmp_path: Path, mounter: Mounter) -> None:
    """max_generated_bytes: the sidecar and index of a too-long key path fail with EIO; the tensor still reads."""
    mnt = mounter(long_paths(tmp_path / "long_paths.pt", key_length=100), "--limit", "max_generated_bytes=2000")
    files = walk_files(mnt)
    (tensor,) = [f for f in files if f.count("/") == 30 and not f.endswith((".json", ".npy"))]
    assert (mnt / tensor).read_bytes() == torch.tensor([1.0, 2.0, 3.0, 4.0]).numpy().tobytes()
    for generated in (mnt / (tensor + ".json"), mnt / ".ckptfs" / "index.json"):
        assert generated.stat().st_size == 1  # not 0: a read must reach the daemon to fail
        with pytest.raises(OSError) as failed:
            generated.read_bytes()
        assert failed.value.errno == errno.EIO
    assert (mnt / tensor).read_bytes()[:4] == torch.tensor([1.0]).numpy().tobytes()
