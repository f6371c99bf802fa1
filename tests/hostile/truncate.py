"""Where to cut a checkpoint: every structure boundary of it, both ends, and a regular spread."""

from __future__ import annotations

import io
import tarfile

from ckptfs.errors import CkptfsError
from ckptfs.pickle.unpickler import SafeUnpickler

ZIP_SIGNATURES = (b"PK\x03\x04", b"PK\x01\x02", b"PK\x06\x06", b"PK\x06\x07", b"PK\x05\x06")


def truncation_offsets(data: bytes) -> list[int]:
    marks = {*range(17), *range(len(data) - 32, len(data)), *range(0, len(data), 53)}
    for signature in ZIP_SIGNATURES:
        position = data.find(signature)
        while position >= 0:
            marks |= {position - 1, position, position + 1, position + 4, position + 30}
            position = data.find(signature, position + 1)
    marks |= {end + delta for end in _legacy_pickle_ends(data) for delta in (-1, 0, 1, 8, 9)}
    marks |= {start + delta for start in tar_member_offsets(data) for delta in (-1, 0, 1, 512, 513)}
    return sorted(m for m in marks if 0 <= m < len(data))


def tar_member_offsets(data: bytes) -> list[int]:
    """Where each member's header of a tar starts, and where the archive's end blocks start."""
    if data[257:262] != b"ustar":
        return []
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = tar.getmembers()
    return [m.offset for m in members] + [members[-1].offset_data + -(-members[-1].size // 512) * 512]


def _legacy_pickle_ends(data: bytes) -> list[int]:
    ends, pos = [], 0
    if data[:2] != b"\x80\x02":
        return ends
    for _ in range(5):
        unpickler = SafeUnpickler(data, persistent_load=lambda pid: pid)
        unpickler.pos = pos
        try:
            unpickler.load()
        except CkptfsError:
            break
        ends.append(unpickler.pos)
        pos = unpickler.pos
    return ends
