"""The bytes of a metadata cache entry: a header naming the format version, the key and the payload's length
and CRC-32, then named sections (int64 or float64 arrays, or raw bytes), each 8-byte aligned.

Nothing in it is executed or trusted: a header, checksum or section that does not check is a bad entry. The
checksum catches a torn or damaged file, as a digest would at five times the cost (17 ms for a 200,000-tensor entry);
a hostile writer can make either match, and what stops it is the checks of every value.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

from ckptfs.cache.entry_key import FORMAT_VERSION, key_digest
from ckptfs.cache.errors import BadEntry
from ckptfs.cache.layout import Sections

MAGIC = b"CKPTFSMC"
HEADER = struct.Struct("<8sI32sQI")
"""Magic, format version, digest of the key, payload length, CRC-32 of the payload."""
SECTION = struct.Struct("<32sBQ")
"""Name (NUL-padded), kind, length in bytes."""
KINDS = {0: None, 1: np.dtype("<i8"), 2: np.dtype("<f8"), 3: np.dtype("<i4"), 4: np.dtype("<i2"), 5: np.dtype("<i1")}
"""Raw bytes, or an array; integers are stored in the narrowest of these widths that holds them."""
NARROW = ((5, 1 << 7), (4, 1 << 15), (3, 1 << 31))
MAX_SECTIONS = 64


def encode_entry(key: str, sections: Sections) -> bytes:
    parts = [struct.pack("<I", len(sections))]
    for name, value in sections.items():
        if isinstance(value, np.ndarray):
            kind = _int_kind(value) if value.dtype.kind in "iu" else 2
            data = value.astype(KINDS[kind]).tobytes()
        else:
            kind, data = 0, bytes(value)
        parts += [SECTION.pack(name.encode("ascii"), kind, len(data)), data, b"\0" * (-len(data) % 8)]
    payload = b"".join(parts)
    return HEADER.pack(MAGIC, FORMAT_VERSION, key_digest(key), len(payload), zlib.crc32(payload)) + payload


def _int_kind(value: np.ndarray) -> int:
    low, high = (int(value.min()), int(value.max())) if len(value) else (0, 0)
    return next((kind for kind, end in NARROW if -end <= low and high < end), 1)


def decode_entry(key: str, data: bytes) -> Sections:
    """The sections of an entry written for ``key``; BadEntry unless everything checks."""
    if len(data) < HEADER.size:
        raise BadEntry("entry shorter than its header")
    magic, version, digest_of_key, length, checksum = HEADER.unpack_from(data)
    if magic != MAGIC or version != FORMAT_VERSION:
        raise BadEntry("not an entry of this cache format")
    if digest_of_key != key_digest(key):
        raise BadEntry("entry written for another key")
    payload = memoryview(data)[HEADER.size :]
    if length != len(payload) or zlib.crc32(payload) != checksum:
        raise BadEntry("entry truncated or corrupt (checksum)")
    return _sections(payload)


def _sections(payload: memoryview) -> Sections:
    if len(payload) < 4:
        raise BadEntry("entry without a section count")
    (count,) = struct.unpack_from("<I", payload)
    if count > MAX_SECTIONS:
        raise BadEntry(f"entry claims {count} sections")
    pos = 4
    sections: Sections = {}
    for _ in range(count):
        if pos + SECTION.size > len(payload):
            raise BadEntry("section header past the end of the entry")
        raw_name, kind, size = SECTION.unpack_from(payload, pos)
        pos += SECTION.size
        end = pos + size
        if kind not in KINDS or end > len(payload):
            raise BadEntry("section of unknown kind or past the end of the entry")
        dtype = KINDS[kind]
        name = raw_name.rstrip(b"\0").decode("ascii", "replace")
        if dtype is None:
            sections[name] = bytes(payload[pos:end])
        elif size % dtype.itemsize:
            raise BadEntry(f"array section {name} of {size} bytes")
        else:
            sections[name] = np.frombuffer(payload, dtype=dtype, count=size // dtype.itemsize, offset=pos).astype(
                np.float64 if kind == 2 else np.int64)
        pos = end + (-size % 8)
    if pos != len(payload):
        raise BadEntry("bytes after the last section")
    return sections
