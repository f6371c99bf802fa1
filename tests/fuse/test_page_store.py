"""Which files a listing stores into the kernel's page cache (``InodeFS._store_listed``), called directly with the
batches caught: value files up to a page, each with the bytes torch's value gives, once, none that fails; nothing
until a value file is read."""

from __future__ import annotations

import ctypes
import errno
from pathlib import Path
from typing import Any

import pytest
import torch
from corpus import save_zip

import ckptfs
from ckptfs.fs.layout import Layout
from ckptfs.fs.nodes import Dir, Kind, Node
from ckptfs.fuse import bindings as libfuse
from ckptfs.fuse import inodes
from ckptfs.fuse.inodes import InodeFS
from ckptfs.fuse.page_store import Batch

BIG = "b" * inodes.STORE_FILE_BYTES
"""Its file is one byte more than a page (the newline): not stored."""
VALUES = [0.1, "x", None, b"\x00\xff", 7, True, "héllo", BIG, b"", 1 << 70, -0.0]


class Caught:
    def __init__(self) -> None:
        self.batches: list[Batch] = []

    def put(self, batch: Batch) -> None:
        self.batches.append(batch)

    def files(self) -> dict[int, bytes]:
        found = {ino: data for batch in self.batches for ino, data in batch}
        assert len(found) == sum(len(batch) for batch in self.batches), "a file stored twice"
        return found


def _expected(value: Any) -> bytes:
    """A value's file as docs/mount.md says (str, bytes, int, float, bool, None)."""
    if isinstance(value, bytes):
        return value
    return (value if isinstance(value, str) else repr(value)).encode() + b"\n"


@pytest.fixture
def mounted(tmp_path: Path) -> Any:
    source = save_zip({"vals": VALUES, "deep": {"a": {"s": "run/1", "n": None}}, "t": {"w": torch.zeros(3)}},
                      tmp_path / "values.pt")
    loaded = torch.load(source, weights_only=False)  # made by this test: weights_only refuses bytes
    with ckptfs.open(source) as ck:
        fs = InodeFS(ck, Layout(ck))
        caught = Caught()
        fs._store = caught  # type: ignore[assignment]
        yield fs, caught, loaded


def _directory(fs: InodeFS, path: str) -> Dir:
    node = fs.layout.lookup(path)
    assert isinstance(node, Dir)
    return node


def _bufvec_bytes(address: int) -> bytes:
    vec = libfuse.FuseBufvec.from_address(address)
    bufs = (libfuse.FuseBuf * vec.count).from_address(address + libfuse.FuseBufvec.buf.offset)
    assert not any(buf.flags & libfuse.FUSE_BUF_IS_FD for buf in bufs)
    return b"".join(ctypes.string_at(buf.mem, buf.size) for buf in bufs)


def _listed(fs: InodeFS, directory: Dir) -> list[Node]:
    return fs.layout.listing(directory)


def test_a_listing_stores_its_small_value_files_with_torchs_bytes(mounted: Any) -> None:
    fs, caught, loaded = mounted
    directory = _directory(fs, "/vals")
    end = len(_listed(fs, directory)) + 2
    fs._store_listed(directory, end)
    by_ino = {node.ino: int(node.name) for node in _listed(fs, directory)}
    stored = {by_ino[ino]: data for ino, data in caught.files().items()}
    small = {i: _expected(v) for i, v in enumerate(loaded["vals"]) if 0 < len(_expected(v)) <= inodes.STORE_FILE_BYTES}
    assert stored == small
    assert VALUES.index(BIG) not in stored and VALUES.index(b"") not in stored and len(small) == len(VALUES) - 2
    fs._store_listed(directory, end)  # listed again: nothing stored twice
    assert len(caught.batches) == 1


def test_a_listing_read_in_parts_stores_each_part_once(mounted: Any) -> None:
    fs, caught, loaded = mounted
    directory = _directory(fs, "/vals")
    end = len(_listed(fs, directory)) + 2
    fs._store_listed(directory, 2)  # only . and .. taken yet
    fs._store_listed(directory, 6)
    fs._store_listed(directory, 5)  # an older request's offset
    fs._store_listed(directory, end)
    names = {node.ino: int(node.name) for node in _listed(fs, directory)}
    first, rest = ({names[ino] for ino, _ in batch} for batch in caught.batches)
    assert first == {0, 1, 2, 3} and rest == {i for i in range(4, len(VALUES)) if VALUES[i] not in (BIG, b"")}
    assert sorted(caught.files().values()) == sorted(
        _expected(v) for v in loaded["vals"] if 0 < len(_expected(v)) <= inodes.STORE_FILE_BYTES)


def test_a_value_whose_bytes_fail_is_not_stored(mounted: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    fs, caught, _ = mounted
    directory = _directory(fs, "/deep/a")
    failing = fs.layout.entry(directory, "s")
    made = fs.layout.content

    def content(node: Node) -> bytes | bytearray:
        if node.ino == failing.ino:
            raise ValueError("too long")
        return made(node)

    monkeypatch.setattr(fs.layout, "content", content)
    fs._store_listed(directory, 4)
    assert list(caught.files().values()) == [b"None\n"]


def test_directories_of_tensors_or_containers_store_nothing(mounted: Any) -> None:
    fs, caught, _ = mounted
    for path in ("/t", "/deep", "/"):
        directory = _directory(fs, path)
        fs._store_listed(directory, len(_listed(fs, directory)) + 2)
    assert caught.batches == []
    assert _listed(fs, _directory(fs, "/t"))[0].kind is Kind.TENSOR


def test_no_more_than_store_files_per_directory(mounted: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    fs, caught, _ = mounted
    monkeypatch.setattr(inodes, "STORE_FILES", 5)
    directory = _directory(fs, "/vals")
    fs._store_listed(directory, len(_listed(fs, directory)) + 2)
    fs._store_listed(directory, len(_listed(fs, directory)) + 2)
    assert sorted(caught.files().values()) == sorted(_expected(v) for v in VALUES[:3])


def test_no_more_than_stored_files_in_a_mount(mounted: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    fs, caught, _ = mounted
    monkeypatch.setattr(fs, "_store_budget", 4)
    vals, deep = _directory(fs, "/vals"), _directory(fs, "/deep/a")
    fs._store_listed(deep, len(_listed(fs, deep)) + 2)
    fs._store_listed(vals, len(_listed(fs, vals)) + 2)
    fs._store_listed(vals, len(_listed(fs, vals)) + 2)
    assert sorted(caught.files().values()) == sorted([b"run/1\n", b"None\n", *(_expected(v) for v in VALUES[:2])])
    assert fs._store_budget == 0


def test_listings_store_nothing_until_a_value_file_is_read(mounted: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests answered with ``fuse_reply_buf`` caught (no kernel to answer): the listing, then a tensor's sidecar
    read, then a value's."""
    fs, caught, _ = mounted
    replies: list[bytes] = []
    monkeypatch.setattr(inodes.ll, "reply_buf", lambda req, data, size: replies.append(
        data[:size] if isinstance(data, bytes) else ctypes.string_at(data, size) if size else b""))
    monkeypatch.setattr(inodes.ll, "reply_data", lambda req, bufvec, flags: replies.append(_bufvec_bytes(bufvec)))
    monkeypatch.setattr(inodes.ll, "reply_err", lambda req, code: pytest.fail(f"answered {errno.errorcode[code]}"))
    vals, tensors = _directory(fs, "/vals"), _directory(fs, "/t")
    for directory in (vals, tensors):
        end = len(_listed(fs, directory)) + 2
        fs._readdirplus(0, directory.ino, 1 << 16, 0, None)
        fs._readdirplus(0, directory.ino, 1 << 16, end, None)
    sidecar = next(node for node in _listed(fs, tensors) if node.kind is Kind.VIEW and node.name.endswith(".json"))
    fs._read(0, sidecar.ino, 1 << 16, 0, None)
    assert caught.batches == [] and replies[-1] == bytes(fs.layout.content(sidecar))
    seven = fs.layout.entry(vals, "4")
    fs._read(0, seven.ino, 1 << 16, 0, None)
    assert replies[-1] == b"7\n"
    assert len(caught.files()) == len(VALUES) - 2
    deep = _directory(fs, "/deep/a")
    fs._readdirplus(0, deep.ino, 1 << 16, 4, None)  # from now on, listings store
    assert sorted(caught.batches[-1]) == sorted([(fs.layout.entry(deep, "s").ino, b"run/1\n"),
                                                (fs.layout.entry(deep, "n").ino, b"None\n")])


def test_a_long_listing_is_handed_over_in_batches(mounted: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    fs, caught, loaded = mounted
    monkeypatch.setattr(inodes, "STORE_BATCH", 4)
    directory = _directory(fs, "/vals")
    fs._store_listed(directory, len(_listed(fs, directory)) + 2)
    assert [len(batch) for batch in caught.batches] == [4, 4, 1]
    assert [data for batch in caught.batches for _, data in batch] == [
        _expected(v) for v in loaded["vals"] if 0 < len(_expected(v)) <= inodes.STORE_FILE_BYTES]
