"""Plain values' files through a real mount, read as torch loads the values: text and a newline for str, int,
float, bool and None, the raw bytes for bytes, ``info``'s JSON for the rest (docs/mount.md). A read-only mount's
reads come without opens, each finding its file by path among a bounded set (``fuse.opened``): many files read
one after another, each must be its own, whole, whatever was read before it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import torch
from corpus import save_zip

import ckptfs
from ckptfs.fs.layout import Layout
from ckptfs.fuse.opened import KEPT_FILES
from mount.helpers import Mounter

LONG_TEXT = "".join(chr(0x20 + i % 0x5F) for i in range(300_000)) + "é✓"
"""Longer than a read request (128 KiB to 1 MiB): its file is read in several."""
KINDS = {
    "text": "run/1", "unicode": "héllo ✓ 𝜋", "empty_text": "", "lines": "a\nb\n", "long_text": LONG_TEXT,
    "zero": 0, "negative": -7, "big": 1 << 70, "huge": 1 << 13000, "true": True, "false": False, "none": None,
    "tenth": 0.1, "negative_zero": -0.0, "nan": float("nan"), "inf": float("inf"), "minus_inf": float("-inf"),
    "tiny": 5e-324, "blob": b"\x00\xff\n", "empty_blob": b"", "long_blob": bytes(range(256)) * 1000,
    "complex": complex(1, -2.5), "set": {3, 1, 2}, "dtype": torch.bfloat16,
}


def _expected(value: Any) -> bytes:
    """A value's file as docs/mount.md says, from the value torch loaded."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8") + b"\n"
    if value is None or isinstance(value, (bool, float)):
        return repr(value).encode() + b"\n"
    if isinstance(value, int):
        return repr(value).encode() + b"\n"
    if isinstance(value, complex):
        form: Any = {"$complex": [value.real, value.imag]}
    elif isinstance(value, set):
        form = {"$set": sorted(value, key=repr)}
    elif isinstance(value, torch.dtype):
        form = {"$global": str(value)}
    else:
        raise AssertionError(f"no expectation for {value!r}")
    return json.dumps(form, ensure_ascii=False).encode() + b"\n"


def _loaded(path: Path) -> Any:
    return torch.load(path, weights_only=False)  # made by this test: weights_only refuses LONG4 (1 << 13000)


def test_every_kind_of_value_reads_as_torch_loads_it(tmp_path: Path, mounter: Mounter) -> None:
    source = save_zip({**KINDS, "nested": {"list": [1, "two", 3.0, None, b"5"], "deeper": {"x": KINDS}}},
                      tmp_path / "values.pt")
    loaded = _loaded(source)
    mnt = mounter(source)
    for root, values in ((mnt, loaded), (mnt / "nested" / "deeper" / "x", loaded["nested"]["deeper"]["x"])):
        for name in KINDS:
            value = values[name]
            assert (root / name).stat().st_size == len(_expected(value)), name
            assert (root / name).read_bytes() == _expected(value), name
    for index, value in enumerate(loaded["nested"]["list"]):
        assert (mnt / "nested" / "list" / str(index)).read_bytes() == _expected(value)
    with open(mnt / "long_text", "rb", buffering=0) as f:  # a read starting far into the file
        assert os.pread(f.fileno(), 100, 299_995) == LONG_TEXT[299_995:].encode() + b"\n"
    assert (mnt / "long_blob").read_bytes() == KINDS["long_blob"]


def test_many_files_read_once_are_each_their_own(tmp_path: Path, mounter: Mounter) -> None:
    """More files than are kept, each read whole by one cat in find's order, then again one at a time backwards;
    the index (read in several requests after them) is the one the checkpoint makes."""
    count = 3 * KEPT_FILES
    obj = {"losses": [i / 7 for i in range(count)],
           "names": {f"p{i}": f"layer.{i}" * (i % 5) for i in range(count // 2)}, "epoch": 3}
    source = save_zip(obj, tmp_path / "many.pt")
    loaded = _loaded(source)
    mnt = mounter(source)
    listed = subprocess.run(["find", str(mnt), "-type", "f", "-print0"], capture_output=True, check=True).stdout
    files = listed.decode().split("\0")[:-1]
    expected = {str(mnt / "losses" / str(i)): _expected(v) for i, v in enumerate(loaded["losses"])}
    expected |= {str(mnt / "names" / k): _expected(v) for k, v in loaded["names"].items()}
    expected[str(mnt / "epoch")] = b"3\n"
    with ckptfs.open(source) as ck:
        expected[str(mnt / ".ckptfs" / "index.json")] = bytes(Layout(ck).index_bytes())
    assert sorted(files) == sorted(expected) and len(files) == count + count // 2 + 2
    # Every file's first read, in find's order: one cat of them all.
    assert subprocess.run(["cat", *files], capture_output=True, check=True).stdout == b"".join(
        expected[name] for name in files)
    for name in reversed(files):
        assert Path(name).read_bytes() == expected[name], name
