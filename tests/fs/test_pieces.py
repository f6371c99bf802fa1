"""Files as pieces: which parts of which pieces cover a read, and the bufvec FUSE gets for them."""

from __future__ import annotations

import ctypes
import io
from pathlib import Path

import torch
from hypothesis import given
from hypothesis import strategies as st

import ckptfs
from ckptfs.fs.pieces import Content, Literal, Part, SourceBytes, TensorBytes, read_content
from ckptfs.fuse import bindings as libfuse
from ckptfs.reading.extents import Extent
from ckptfs.sources import BytesSource


@given(st.lists(st.binary(max_size=40), max_size=6), st.integers(0, 300), st.integers(0, 300),
       st.one_of(st.none(), st.integers(0, 300)))
def test_parts_cover_exactly_the_bytes_asked_for(chunks: list[bytes], offset: int, size: int, cap: int | None) -> None:
    content = Content([Literal(chunk) for chunk in chunks], cap)
    whole = b"".join(chunks)[: content.size]
    parts = content.cover(offset, size)
    assert b"".join(part.piece.data[part.start : part.start + part.length] for part in parts) == \
        whole[offset : offset + size]
    assert all(part.length > 0 for part in parts)


def test_a_read_spanning_pieces_names_each_piece_once() -> None:
    header, body = Literal(b"HEAD"), Literal(b"0123456789")
    content = Content([header, body])
    assert content.cover(2, 5) == [Part(header, 2, 2), Part(body, 0, 3)]
    assert content.cover(14, 1) == []


def test_a_bufvec_holds_its_buffers_in_order() -> None:
    address = libfuse.bufvec([(7, 4096, 100), b"abc"])
    try:
        count = ctypes.c_size_t.from_address(address).value
        bufs = (libfuse.FuseBuf * count).from_address(address + libfuse.FuseBufvec.buf.offset)
        assert count == 2
        assert (bufs[0].size, bufs[0].fd, bufs[0].pos) == (100, 7, 4096)
        assert bufs[0].flags == libfuse.FUSE_BUF_IS_FD | libfuse.FUSE_BUF_FD_SEEK
        assert (bufs[1].size, bufs[1].flags) == (3, 0)
        assert ctypes.string_at(bufs[1].mem, 3) == b"abc"
    finally:
        libfuse._free(bufs[1].mem)
        libfuse._free(address)


def test_read_content_reads_each_kind_of_piece_for_the_range_asked(tmp_path: Path) -> None:
    """Literal bytes, a source extent and a gathered tensor range, read as one file's bytes."""
    t = torch.arange(12, dtype=torch.int16).reshape(3, 4)
    buffer = io.BytesIO()
    torch.save({"t": t.t()}, buffer)
    ck = ckptfs.open(BytesSource(buffer.getvalue()))
    tensor = ck.tensors[0]
    other = BytesSource(b"0123456789")
    content = Content([Literal(b"HEAD"), SourceBytes(Extent(other, 2, 5)), TensorBytes(tensor, 4, 20)])
    whole = b"HEAD" + b"23456" + t.t().contiguous().numpy().tobytes()[4:]
    for offset, size in [(0, 100), (2, 5), (6, 9), (9, 3), (28, 10), (29, 1)]:
        assert read_content(ck, content, offset, size) == whole[offset : offset + size]
