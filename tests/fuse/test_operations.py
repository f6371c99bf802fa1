"""FUSE callbacks called directly (no mount): listings answer with the attributes getattr gives, within a bound."""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path

import pytest
import torch
from corpus import save_zip

import ckptfs
from ckptfs import Limits
from ckptfs.fs.layout import Layout
from ckptfs.fs.nodes import Dir
from ckptfs.fs.pieces import Content, Literal, piece_bytes
from ckptfs.fuse import bindings as libfuse
from ckptfs.fuse import operations as fuse_ops
from ckptfs.fuse.inodes import InodeFS
from ckptfs.fuse.opened import KeptFiles, OpenFile
from ckptfs.sources import BytesSource


def _stat_of(fs: fuse_ops.CheckpointFS, path: str) -> bytes:
    st = fuse_ops._STAT()
    assert fs.getattr(path.encode(), ctypes.pointer(st)) == 0
    return bytes(st)


def _checkpoint(tmp_path: Path) -> Path:
    shared = torch.arange(4.0)
    return save_zip({"a": {f"w{n}": torch.zeros(n) for n in range(5)}, "b": [shared, shared, 3, "x"],
                     "c": {}}, tmp_path / "c.pt")


def _readdir(fs: fuse_ops.CheckpointFS, path: str, room: int = 1 << 30) -> list[tuple[str, bytes, int]]:
    """A whole listing through ``readdir`` as the kernel asks for it: requests of ``room`` entries, each
    resuming at the offset of the last entry taken. (name, ``struct stat``, offset) per entry."""
    found: list[tuple[str, bytes, int]] = []
    offset = 0
    while True:
        taken: list[tuple[str, bytes, int]] = []

        def filler(buf: int, name: bytes, st: int, off: int, flags: int) -> int:
            if len(taken) == room:
                return 1
            taken.append((name.decode(), ctypes.string_at(st, ctypes.sizeof(fuse_ops._STAT)), off))
            return 0

        callback = fuse_ops._RawFiller(filler)
        assert fs.readdir(path.encode(), 0, ctypes.cast(callback, ctypes.c_void_p).value, offset, 0) == 0
        if not taken:
            return found
        found += taken
        offset = taken[-1][2]


@pytest.mark.parametrize("room", [1, 3, 1000])
def test_listings_hold_what_getattr_gives(tmp_path: Path, room: int) -> None:
    with ckptfs.open(_checkpoint(tmp_path)) as ck:
        layout = Layout(ck)
        fs = fuse_ops.CheckpointFS(ck, layout)
        for path in ("/", "/a", "/b", "/c", "/.ckptfs"):
            directory = layout.lookup(path)
            assert isinstance(directory, Dir)
            listed = _readdir(fs, path, room)
            names = [".", ".."] + [node.name for node in layout.listing(directory)]
            assert [name for name, _, _ in listed] == names
            assert [offset for _, _, offset in listed] == list(range(1, len(names) + 1))
            parent = path.rpartition("/")[0] or "/"
            for name, st, _ in listed:
                entry = path if name == "." else parent if name == ".." else f"{path.rstrip('/')}/{name}"
                assert st == _stat_of(fs, entry), entry
            # Sizes are kept for a big directory only: a small one's are made again as cheaply as they are found.
            assert (fs._listing(directory) is fs._listing(directory)) is (len(names) >= fuse_ops.KEPT_LISTING)


def test_a_big_directory_lists_in_windows(tmp_path: Path) -> None:
    """More entries than the biggest window: every entry once, in order, with its attributes."""
    tensors = {f"t{n}": torch.full((n % 3,), float(n)) for n in range(2 * fuse_ops.SIZES_WINDOW // 3 + 5)}
    with ckptfs.open(save_zip(tensors, tmp_path / "big.pt")) as ck:
        layout = Layout(ck)
        fs = fuse_ops.CheckpointFS(ck, layout)
        listed = _readdir(fs, "/", room=5000)
        names = [".", ".."] + [node.name for node in layout.listing(layout.root)]
        assert len(names) > fuse_ops.SIZES_WINDOW
        assert [name for name, _, _ in listed] == names
        for name, st, _ in listed[2::97]:
            assert st == _stat_of(fs, "/" + name), name


@pytest.mark.parametrize("narrow, typecode", [(8000, "q"), (1 << 32, "I")])
def test_a_listing_keeps_its_sizes_as_wide_as_they_need(tmp_path: Path, narrow: int, typecode: str) -> None:
    """Sizes are kept in 4 bytes each until one needs more (here in the second window: tensors grow by 4 bytes
    each), then in 8; the listing shows each entry's size either way."""
    tensors = {f"t{n}": torch.zeros(n) for n in range(2 * fuse_ops.SIZES_WINDOW // 3 + 5)}
    with ckptfs.open(save_zip(tensors, tmp_path / "grow.pt")) as ck, pytest.MonkeyPatch.context() as patch:
        patch.setattr(fuse_ops, "_MAX_NARROW_SIZE", narrow - 1)
        layout = Layout(ck)
        fs = fuse_ops.CheckpointFS(ck, layout)
        listed = _readdir(fs, "/", room=5000)
        assert fs._listing(layout.root).sizes.typecode == typecode
        assert [fuse_ops._STAT.from_buffer_copy(st).st_size for _, st, _ in listed] == [
            fuse_ops._STAT.from_buffer_copy(_stat_of(fs, "/" + name if name not in (".", "..") else "/")).st_size
            for name, _, _ in listed]
        assert max(fuse_ops._STAT.from_buffer_copy(st).st_size for _, st, _ in listed) >= 4 * 2700


def test_kept_listings_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fuse_ops, "MAX_LISTED_ENTRIES", 10)
    monkeypatch.setattr(fuse_ops, "KEPT_LISTING", 1)
    with ckptfs.open(_checkpoint(tmp_path)) as ck:
        layout = Layout(ck)
        fs = fuse_ops.CheckpointFS(ck, layout)
        first = layout.lookup("/a")
        assert isinstance(first, Dir)
        kept = fs._listing(first)  # '.', '..' and ten entries: over the bound on its own, kept until the next
        assert fs._listing(first) is kept
        second = layout.lookup("/b")
        assert isinstance(second, Dir)
        fs._listing(second)
        assert fs._listing(first) is not kept
        assert fs._listed <= 10 + len(kept.sizes)


def test_an_entry_whose_size_fails_lists_one_byte_and_its_siblings_keep_theirs(tmp_path: Path) -> None:
    """Sizes are computed for a whole listing at once; one sidecar over max_generated_bytes spoils only itself."""
    path = save_zip({"a": torch.zeros(2), "k" * 3000: torch.ones(3), "z": torch.zeros(1)}, tmp_path / "long.pt")
    with ckptfs.open(path, Limits(max_generated_bytes=2000)) as ck:
        layout = Layout(ck)
        fs = fuse_ops.CheckpointFS(ck, layout)
        sizes = {name: fuse_ops._STAT.from_buffer_copy(st).st_size for name, st, _ in _readdir(fs, "/")}
        long_name = layout.node_of(ck.tensors[1]).name
        assert sizes[long_name + ".json"] == fuse_ops.UNKNOWN_SIZE == 1
        assert sizes[long_name] == 12
        for name in ("a.json", "z.json"):
            assert sizes[name] == len(layout.content(layout.lookup("/" + name))) > 0


def test_a_read_across_a_views_header_is_one_answer_with_its_data_as_fd_ranges(tmp_path: Path) -> None:
    """model.safetensors and .npy: the header as bytes, each stored tensor as a file-descriptor range."""
    w, v = torch.randn(8, 4), torch.arange(6, dtype=torch.int16)
    with ckptfs.open(save_zip({"w": w, "v": v, "t": w.t()}, tmp_path / "v.pt")) as ck:
        layout = Layout(ck)
        fs = fuse_ops.CheckpointFS(ck, layout)
        for name in ("/model.safetensors", "/w.npy"):
            opened = fs._open(name, layout.lookup(name))  # type: ignore[arg-type]
            assert opened.fd < 0  # several pieces: answered from them
            buffers = fs._buffers(opened.content.cover(0, opened.content.size))
            fd = ck.source.fileno()
            ranges = [b for b in buffers if isinstance(b, tuple)]
            assert isinstance(buffers[0], bytes) and ranges and all(b[0] == fd for b in ranges)
            data = b"".join(b if isinstance(b, bytes) else ck.source.read(b[1], b[2]) for b in buffers)
            node = layout.lookup(name)
            assert node is not None
            assert data == b"".join(piece_bytes(piece, ck.read) for piece in layout.pieces(node))
        stored = [b for b in fs._buffers(fs._open("/model.safetensors", layout.lookup("/model.safetensors"))
                                         .content.cover(0, 1 << 20)) if isinstance(b, tuple)]  # type: ignore[arg-type]
        assert sorted(length for _, _, length in stored) == sorted([v.nbytes, w.nbytes])  # t is gathered


def _read_by_ino(fs: InodeFS, ino: int, size: int, offset: int) -> bytes | int:
    """A read as libfuse's low-level API makes it without an open (file handle 0): the bytes its bufvec holds, or
    the error."""
    answer = ctypes.c_void_p()
    status = fs.read_buf(ctypes.addressof(answer), size, offset, 0, ino)
    if status:
        return status
    assert answer.value is not None
    vec = libfuse.FuseBufvec.from_address(answer.value)
    bufs = (libfuse.FuseBuf * vec.count).from_address(answer.value + libfuse.FuseBufvec.buf.offset)
    try:
        return b"".join(os.pread(buf.fd, buf.size, buf.pos) if buf.flags & libfuse.FUSE_BUF_IS_FD else
                        ctypes.string_at(buf.mem, buf.size) for buf in bufs)
    finally:
        libfuse.free_bufvec(answer.value)


def test_reads_without_an_open_find_each_file_by_inode_number(tmp_path: Path) -> None:
    w = torch.arange(6.0)
    with ckptfs.open(save_zip({"w": w, "lr": 0.5, "name": "é" * 50, "t": w[::2]}, tmp_path / "r.pt")) as ck:
        layout = Layout(ck)
        fs = InodeFS(ck, layout)
        npy = layout.pieces(layout.lookup("/w.npy"))  # type: ignore[arg-type]
        wanted = {"/w": w.numpy().tobytes(), "/t": w[::2].numpy().tobytes(), "/lr": b"0.5\n",
                  "/name": ("é" * 50 + "\n").encode(), "/w.json": bytes(layout.content(layout.lookup("/w.json"))),
                  "/w.npy": b"".join(piece_bytes(piece, ck.read) for piece in npy),
                  "/.ckptfs/index.json": bytes(layout.index_bytes())}
        inos = {path: layout.lookup(path).ino for path in wanted}  # type: ignore[union-attr]
        for _ in range(2):  # made, then kept
            for path, data in wanted.items():
                assert _read_by_ino(fs, inos[path], 1 << 20, 0) == data, path
                assert _read_by_ino(fs, inos[path], 7, 3) == data[3:10], path
                assert _read_by_ino(fs, inos[path], 10, len(data)) == b""
        assert len(fs._kept) == len(wanted)
        for missing in (1, 2, inos["/w"] + 7, 1 << 40):  # the root, /.ckptfs, a free view slot, no block's
            assert _read_by_ino(fs, missing, 10, 0) == -errno.EIO


def test_files_kept_for_reads_without_an_open_are_bounded(tmp_path: Path) -> None:
    kept = KeptFiles(files=3, nbytes=100)
    made = [OpenFile(str(i), Content([Literal(bytes(30))]), data=bytes(30)) for i in range(5)]
    for i, opened in enumerate(made[:3]):
        kept.add(i, opened)
    assert len(kept) == 3 and kept.nbytes == 90 and kept.get(2) is made[2]
    kept.add(3, made[3])  # a fourth file: all let go first
    assert len(kept) == 1 and kept.nbytes == 30 and kept.get(0) is None and kept.get(3) is made[3]
    big = OpenFile("big", Content([Literal(bytes(500)), Literal(bytes(20))]))
    kept.add(99, big)  # over the bytes alone: kept by itself
    assert len(kept) == 1 and kept.nbytes == 520 and kept.get(99) is big
    kept.add(4, made[4])
    assert len(kept) == 1 and kept.nbytes == 30
    kept.add(4, made[0])  # the same file made again (two threads reading it at once): counted once
    assert len(kept) == 1 and kept.nbytes == 30 and kept.get(4) is made[0]


class _LeasingSource(BytesSource):
    """Bytes in a memfd that replies are sent from (``sources.base.BUFFERS``), as a remote source's blocks are."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data, "leasing")
        self.fd = os.memfd_create("leasing", os.MFD_CLOEXEC)
        os.write(self.fd, data)
        self.leased: list[int] = []

    def buffers(self, offset: int, length: int) -> tuple[list[tuple[int, int, int] | bytes], list[int]]:
        self.leased.append(offset)
        half = length // 2
        return [(self.fd, offset, half), self.read(offset + half, length - half)], [offset]

    def release(self, leased: list[int]) -> None:
        for offset in leased:
            self.leased.remove(offset)


def test_a_source_with_buffers_is_answered_from_its_descriptor_leased_until_the_next_read(tmp_path: Path) -> None:
    w = torch.arange(5000.0)
    source = _LeasingSource(save_zip({"w": w, "t": w[::2]}, tmp_path / "l.pt").read_bytes())
    with ckptfs.open(source) as ck:
        layout = Layout(ck)
        fs = InodeFS(ck, layout)
        w_ino, t_ino = layout.lookup("/w").ino, layout.lookup("/t").ino  # type: ignore[union-attr]
        assert _read_by_ino(fs, w_ino, 8000, 100) == w.numpy().tobytes()[100:8100]
        answer = ctypes.c_void_p()
        assert fs.read_buf(ctypes.addressof(answer), 4096, 0, 0, w_ino) == 0
        assert len(source.leased) == 1  # the last reply's, held while libfuse sends it: the one before released
        bufs = (libfuse.FuseBuf * 2).from_address(answer.value + libfuse.FuseBufvec.buf.offset)  # type: ignore
        assert bufs[0].flags & libfuse.FUSE_BUF_IS_FD and (bufs[0].fd, bufs[0].size) == (source.fd, 2048)
        assert not bufs[1].flags & libfuse.FUSE_BUF_IS_FD and bufs[1].size == 2048
        libfuse.free_bufvec(answer.value)
        assert _read_by_ino(fs, t_ino, 1 << 20, 0) == w[::2].numpy().tobytes()  # gathered: no lease
        assert source.leased == []
    os.close(source.fd)
