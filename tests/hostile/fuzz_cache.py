"""Fuzzing the metadata cache's reader: inputs that are a cache entry (its digest made to match, as a
hostile writer of the cache folder would) and the checkpoint it describes.

An input is ``ENTRY_INPUT``, the entry's length, the entry, then the checkpoint's bytes; or, for a directory (a
torch.distributed.checkpoint), its files with the entry as one more, ``ENTRY_MEMBER``. Reading it may raise
only ``CkptfsError`` (``BadEntry`` for an entry refused), like every other input.
"""

from __future__ import annotations

import random
import struct
from typing import Union

import numpy as np

from ckptfs.cache.entry_file import decode_entry, encode_entry
from ckptfs.cache.layout import Sections
from ckptfs.cache.parsed_codec import decode_parsed, encode_parsed
from ckptfs.checkpoint import Checkpoint
from ckptfs.errors import CkptfsError
from ckptfs.formats.detect import open_parsed
from ckptfs.limits import Limits
from ckptfs.sources import ByteSource, BytesSource
from hostile.memory_directory import BytesDirectory

ENTRY_INPUT = b"ckptfs cache entry input\n"
ENTRY_MEMBER = ".ckptfs-cache-entry"
Input = Union[bytes, dict[str, bytes]]
KEY = "fuzz"
VALUES = (-1, 0, 1, 2, 7, 255, 1 << 16, 1 << 31, 1 << 40, (1 << 63) - 1, -(1 << 63))


def entry_sections(seed: Input) -> Sections | None:
    """The sections of the entry ckptfs writes for a seed checkpoint, or None for a seed it does not cache."""
    source: ByteSource = BytesDirectory(seed) if isinstance(seed, dict) else BytesSource(seed, "seed.pt")
    try:
        parsed = open_parsed(source, Limits())
        Checkpoint(source, parsed)
        return decode_entry(KEY, encode_entry(KEY, encode_parsed(parsed, source)))
    except CkptfsError:
        return None


def mutate_sections(sections: Sections, rng: random.Random) -> Sections:
    """The sections with one to three of them damaged: a value changed to an edge, an array cut or grown, a byte
    changed or the bytes cut."""
    hostile = dict(sections)
    for _ in range(rng.choice((1, 1, 2, 3))):
        name = rng.choice(sorted(hostile))
        value = hostile[name]
        if isinstance(value, np.ndarray):
            value = value.copy()
            if len(value) and rng.random() < 0.8:
                value[rng.randrange(len(value))] = rng.choice(VALUES) if value.dtype == np.int64 else rng.random()
            else:
                value = np.concatenate([value[: rng.randrange(len(value) + 1)], value[:rng.randrange(3)]])
        else:
            raw = bytearray(value)
            if raw and rng.random() < 0.7:
                raw[rng.randrange(len(raw))] = rng.randrange(256)
            else:
                raw = raw[: rng.randrange(len(raw) + 1)]
            value = bytes(raw)
        hostile[name] = value
    return hostile


def mutated_input(sections: Sections, seed: Input, rng: random.Random) -> Input:
    entry = encode_entry(KEY, mutate_sections(sections, rng))
    if rng.random() < 0.05:
        entry = entry[: rng.randrange(len(entry))]
    if isinstance(seed, dict):
        return {**seed, ENTRY_MEMBER: entry}
    return ENTRY_INPUT + struct.pack("<Q", len(entry)) + entry + seed


def open_entry_input(data: Input) -> Checkpoint:
    """The checkpoint an entry input describes, read as a cache hit reads it."""
    if isinstance(data, dict):
        directory = BytesDirectory({name: value for name, value in data.items() if name != ENTRY_MEMBER})
        return Checkpoint(directory, decode_parsed(decode_entry(KEY, data[ENTRY_MEMBER]), directory, Limits()))
    start = len(ENTRY_INPUT) + 8
    (length,) = struct.unpack_from("<Q", data, len(ENTRY_INPUT))
    source = BytesSource(data[start + length :], "fuzz.pt")
    parsed = decode_parsed(decode_entry(KEY, data[start : start + length]), source, Limits())
    return Checkpoint(source, parsed)
