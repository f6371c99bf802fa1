"""Views through real mounts, read by their own libraries (numpy, safetensors) against torch's values."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors
import safetensors.numpy
import safetensors.torch
import torch
import zarr
from corpus import CORPUS_NAMES, CorpusFile, save_zip, torch_bytes
from torch import nn

from ckptfs.fs.safetensors import key_name
from mount.helpers import tensor_file

pytestmark = pytest.mark.mount


def torch_values(t: torch.Tensor) -> np.ndarray | None:
    if t.is_quantized:
        t = t.int_repr()
    try:
        return t.detach().resolve_conj().resolve_neg().numpy()
    except TypeError:
        return None


@pytest.mark.parametrize("name", CORPUS_NAMES)
def test_npy_loads_as_torch_values(corpus: dict[str, CorpusFile], corpus_mounts: dict[str, Path], name: str) -> None:
    loaded = 0
    for path, t in corpus[name].expected.tensors.items():
        f = tensor_file(corpus_mounts[name], path)
        npy = Path(f"{f}.npy")
        meta = json.loads(Path(f"{f}.json").read_text())
        if t.is_meta or t.dtype in (torch.quint4x2, torch.quint2x4):
            assert meta["npy"] is None and not npy.exists(), path
            continue
        size = os.stat(npy).st_size
        array = np.load(npy, mmap_mode="r") if t.numel() else np.load(npy)
        assert size == len(npy.read_bytes()), path
        assert array.shape == t.shape and array.dtype.str == meta["npy"]["descr"], path
        assert array.tobytes() == torch_bytes(t), path
        values = torch_values(t)
        if "raw_bits_of" in meta["npy"]:
            assert meta["npy"]["raw_bits_of"] == meta["dtype"] and array.dtype.kind == "u", path
        elif values is not None:
            assert np.array_equal(array, values, equal_nan=array.dtype.kind in "fc"), path
        loaded += 1
    assert loaded > 0


def st_name(path: tuple[Any, ...]) -> str:
    return ".".join(key_name(key) for key in path)


def _left_out_covers(left_out: list[list[str]], name: str) -> bool:
    return any(name == gone or name.startswith(gone + ".") for gone, _ in left_out)


NUMPY_ST_DTYPES = {"F64", "F32", "F16", "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL", "C64"}


@pytest.mark.parametrize("name", CORPUS_NAMES)
def test_model_safetensors_loads_as_torch_values(corpus: dict[str, CorpusFile], corpus_mounts: dict[str, Path],
                                                 name: str) -> None:
    mnt = corpus_mounts[name]
    expected = {st_name(path): t for path, t in corpus[name].expected.tensors.items()}
    st = mnt / "model.safetensors"
    header_length = int.from_bytes(st.open("rb").read(8), "little")
    header = json.loads(st.open("rb").read(8 + header_length)[8:])
    assert (8 + header_length) % 8 == 0
    assert st.stat().st_size == 8 + header_length + max([e["data_offsets"][1] for k, e in header.items()
                                                        if k != "__metadata__"], default=0)
    meta = header["__metadata__"]
    left_out = json.loads(meta["left_out"])
    assert meta["format"] == "pt" and meta["source"] == str(corpus[name].path)
    loaded = safetensors.torch.load_file(st)
    assert set(loaded) == set(header) - {"__metadata__"}
    with safetensors.safe_open(st, "np") as np_file:
        for key, t in expected.items():
            if key not in loaded:
                assert _left_out_covers(left_out, key), key
                continue
            got = loaded[key]
            assert got.dtype == t.dtype and got.shape == t.shape, key
            assert torch_bytes(got) == torch_bytes(t), key
            if header[key]["dtype"] in NUMPY_ST_DTYPES:
                array = np_file.get_tensor(key)
                assert array.shape == t.shape and array.tobytes() == torch_bytes(t), key
    for gone, why in left_out:
        assert gone not in loaded and why, gone
    numpy_only = {k for k, e in header.items() if k != "__metadata__" and e["dtype"] in NUMPY_ST_DTYPES}
    if len(numpy_only) == len(loaded):
        arrays = safetensors.numpy.load_file(st)
        assert {k: a.tobytes() for k, a in arrays.items()} == {k: torch_bytes(t) for k, t in loaded.items()}


def test_nested_state_dicts_each_have_model_safetensors(mounter: Any, tmp_path: Path) -> None:
    emb = torch.randn(4, 3)
    model = {"emb.weight": emb, "head.weight": emb, "t": emb.t()[1:], "s": torch.tensor(2, dtype=torch.int8),
             "e": torch.empty(0, 5), "bf": torch.randn(3).bfloat16(), "f4": torch.randint(0, 255, (2, 3),
             dtype=torch.uint8).view(torch.float4_e2m1fn_x2), "c128": torch.ones(2, dtype=torch.complex128)}
    ema = nn.Linear(3, 2).state_dict()
    source = save_zip({"model": model, "ema": ema, "epoch": 7, "note": "x"}, tmp_path / "nested.pt")
    mnt = mounter(source)
    index = json.loads((mnt / ".ckptfs" / "index.json").read_text())
    assert index["safetensors"] == ["model.safetensors", "model/model.safetensors", "ema/model.safetensors"]
    for where, state, prefix in (("model", model, ""), ("ema", ema, ""), ("", model, "model."), ("", ema, "ema.")):
        loaded = safetensors.torch.load_file(mnt / where / "model.safetensors")
        for key, t in state.items():
            if t.dtype == torch.complex128:
                assert prefix + key not in loaded
                continue
            assert loaded[prefix + key].dtype == t.dtype and torch_bytes(loaded[prefix + key]) == torch_bytes(t)
    with safetensors.safe_open(mnt / "model" / "model.safetensors", "pt") as f:
        assert json.loads(f.metadata()["left_out"]) == [["c128", "dtype complex128"]]
        assert f.get_slice("t")[1:, :2].tolist() == model["t"][1:, :2].tolist()
    assert not (mnt / "ema" / "weight.safetensors").exists() and not (mnt / "epoch.npy").exists()


NODE_READER = r"""
// Reads a safetensors file with nothing but fs: the 8-byte length, the JSON header, each tensor's bytes.
const fs = require("fs");
const crypto = require("crypto");
const fd = fs.openSync(process.argv[2], "r");
const head = Buffer.alloc(8);
fs.readSync(fd, head, 0, 8, 0);
const length = Number(head.readBigUInt64LE(0));
const text = Buffer.alloc(length);
fs.readSync(fd, text, 0, length, 8);
const header = JSON.parse(text.toString("utf8"));
const out = {};
for (const [name, entry] of Object.entries(header)) {
  if (name === "__metadata__") continue;
  const [start, end] = entry.data_offsets;
  const data = Buffer.alloc(end - start);
  let done = 0;
  while (done < data.length) {
    const got = fs.readSync(fd, data, done, data.length - done, 8 + length + start + done);
    if (got === 0) throw new Error("short read in " + name);
    done += got;
  }
  out[name] = {dtype: entry.dtype, shape: entry.shape, sha256: crypto.createHash("sha256").update(data).digest("hex")};
}
process.stdout.write(JSON.stringify(out));
"""


@pytest.mark.skipif(shutil.which("node") is None and not os.environ.get("CI"), reason="node is not installed")
def test_node_reads_model_safetensors(corpus: dict[str, CorpusFile], corpus_mounts: dict[str, Path],
                                      tmp_path: Path) -> None:
    """Another language's program, its own header parse: every tensor's bytes are torch's."""
    script = tmp_path / "read.js"
    script.write_text(NODE_READER)
    name = "r2_every_dtype"
    done = subprocess.run(["node", str(script), str(corpus_mounts[name] / "model.safetensors")],
                          capture_output=True, text=True, check=True)
    read = json.loads(done.stdout)
    expected = {st_name(path): t for path, t in corpus[name].expected.tensors.items()}
    assert len(read) > 150
    for key, entry in read.items():
        assert entry["sha256"] == hashlib.sha256(torch_bytes(expected[key])).hexdigest(), key
        assert entry["shape"][:-1] == list(expected[key].shape)[:-1], key


@pytest.mark.parametrize("name", CORPUS_NAMES)
def test_zarr_hierarchy_reads_as_torch_values(corpus: dict[str, CorpusFile], corpus_mounts: dict[str, Path],
                                              name: str) -> None:
    mnt = corpus_mounts[name]
    group = zarr.open_group(mnt / ".zarr", mode="r")
    arrays = 0
    for path, t in corpus[name].expected.tensors.items():
        f = tensor_file(mnt, path)
        meta = json.loads(Path(f"{f}.json").read_text())
        key = str(f.relative_to(mnt))
        if meta["npy"] is None:
            assert key not in group, key
            continue
        array = group[key]
        assert isinstance(array, zarr.Array) and array.shape == t.shape, key
        assert array.attrs["ckptfs_dtype"] == meta["dtype"], key
        assert array.dtype == np.dtype(meta["npy"]["descr"]), key
        assert array[...].tobytes() == torch_bytes(t), key
        arrays += 1
    assert arrays > 0
    assert json.loads((mnt / ".zarr" / "zarr.json").read_text()) == {"zarr_format": 3, "node_type": "group",
                                                                     "attributes": {}}
    assert ".zarr" not in os.listdir(mnt) and json.loads((mnt / ".ckptfs" / "index.json").read_text())["zarr"] == \
        ".zarr"


@pytest.mark.parametrize("name", ["r2_every_dtype", "r1_views_containers", "r7_big_endian"])
def test_tensorstore_reads_zarr_arrays(corpus: dict[str, CorpusFile], corpus_mounts: dict[str, Path],
                                       name: str) -> None:
    tensorstore = pytest.importorskip("tensorstore")
    mnt = corpus_mounts[name]
    read = 0
    for path, t in corpus[name].expected.tensors.items():
        f = tensor_file(mnt, path)
        if json.loads(Path(f"{f}.json").read_text())["npy"] is None:
            continue
        store = tensorstore.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(
            mnt / ".zarr" / f.relative_to(mnt))}}, read=True).result()
        array = store.read().result()
        assert array.shape == t.shape and array.tobytes() == torch_bytes(t), path
        read += 1
    assert read > 0


def test_reads_spanning_header_and_data(mounter: Any, tmp_path: Path) -> None:
    """One read across the generated header and the stored data, at every boundary, gives the whole file's bytes."""
    w = torch.randn(64, 33)
    source = save_zip({"w": w, "t": w.t(), "b": torch.arange(5, dtype=torch.bfloat16)}, tmp_path / "span.pt")
    mnt = mounter(source)
    for name in ("model.safetensors", "w.npy", "t.npy", "b.npy"):
        whole = (mnt / name).read_bytes()
        header = 8 + int.from_bytes(whole[:8], "little") if name.endswith("safetensors") else 128
        fd = os.open(mnt / name, os.O_RDONLY)
        try:
            for start in (0, header - 1, header - 100, header):
                for count in (1, 2, 101, 4096, len(whole)):
                    assert os.pread(fd, count, max(0, start)) == whole[max(0, start) : max(0, start) + count]
        finally:
            os.close(fd)
    np.testing.assert_array_equal(np.load(mnt / "w.npy", mmap_mode="r"), w.numpy())
    np.testing.assert_array_equal(np.load(mnt / "t.npy", mmap_mode="r"), w.t().numpy())
