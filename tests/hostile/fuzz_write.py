"""The fuzzer's write step: a tenth of the file inputs are opened with ``mode="r+"`` from a file in memory
(``/dev/shm``) and every writable tensor is written whole; no byte outside the storages' ranges may change but
for CRC fields that then hold a record's CRC-32 (an AssertionError is a crash the fuzzer reports)."""

from __future__ import annotations

import os
import random
import tempfile
import zlib

import ckptfs
from ckptfs.errors import CkptfsError

SHARE = 0.1
MAX_WRITTEN = 1 << 20
"""Bytes written into one tensor at most."""
DIRECTORY = "/dev/shm" if os.path.isdir("/dev/shm") else None


def write_in_place(data: bytes, rng: random.Random) -> None:
    if rng.random() >= SHARE:
        return
    with tempfile.NamedTemporaryFile(dir=DIRECTORY, suffix=".pt") as file:
        file.write(data)
        file.flush()
        ranges: list[tuple[int, int]] = []
        try:
            with ckptfs.open(file.name, mode="r+") as ck:
                ranges = [(s.offset, s.offset + s.nbytes) for s in ck.storages
                          if s.offset >= 0 and s.inline_data is None and not s.compressed]
                assert ck.writer is not None
                for tensor in ck.tensors:
                    if ck.writer.writable(tensor):
                        size = min(tensor.nbytes, MAX_WRITTEN)
                        try:
                            ck.write(tensor, rng.randbytes(size))
                        except CkptfsError:
                            pass
        except CkptfsError:
            pass
        with open(file.name, "rb") as f:
            after = f.read()
    _check_outside(data, after, ranges)


def _check_outside(before: bytes, after: bytes, ranges: list[tuple[int, int]]) -> None:
    assert len(after) == len(before), "the file changed size"
    crcs = {zlib.crc32(after[start:end]).to_bytes(4, "little") for start, end in ranges} | {bytes(4)}
    position = first_change_outside(before, after, ranges, crcs)
    assert position is None, f"byte {position} changed outside every storage range"


def first_change_outside(before: bytes, after: bytes, ranges: list[tuple[int, int]], crcs: set[bytes]) -> int | None:
    """The first byte outside the storages' ranges that changed and is not part of a 4-byte word now holding one
    of ``crcs`` (a record's CRC-32 field; a new CRC may share its first bytes with the old one, so the word is
    any of the four that cover the byte); None when there is none."""
    inside = bytearray(len(before))
    for start, end in ranges:
        inside[start:end] = b"\1" * (end - start)
    for position in range(len(before)):
        if before[position] != after[position] and not inside[position]:
            words = (after[start : start + 4] for start in range(max(0, position - 3), position + 1))
            if not any(len(word) == 4 and word in crcs for word in words):
                return position
    return None
