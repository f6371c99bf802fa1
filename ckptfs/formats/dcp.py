"""The files of torch.distributed.checkpoint (DCP) directories, recognised by content.

A DCP directory holds a ``.metadata`` pickle (``__<rank>.metadata`` ones when
saved without collectives) whose root is a
``torch.distributed.checkpoint.metadata.Metadata`` (torch 1.13's
``torch.distributed._shard.checkpoint``: the same records under its own names), and ``.distcp`` files that
concatenate each item as a complete torch.save archive (spec
``more-formats.md`` A.1–A.3). The directory is read by ``dcp_directory``; a
file of it given alone is named here. A ``.distcp`` of one item is a
torch.save archive of that tensor and opens as one.
"""

from __future__ import annotations

import struct

from ckptfs.sources import ByteSource

METADATA_CLASSES = {"torch.distributed.checkpoint.metadata.Metadata",
                    "torch.distributed._shard.checkpoint.metadata.Metadata"}
"""The root of a ``.metadata``: DCP's, and torch 1.13's (``torch.distributed._shard.checkpoint``, DCP's predecessor)."""
METADATA_FILE = "the .metadata file of a torch.distributed.checkpoint directory: mount the directory"
DISTCP_FILE = "a single .distcp file of a torch.distributed.checkpoint directory: mount the directory"

HEAD_BYTES = 4096
"""Bytes read from a file of a directory: a ``.metadata`` pickle names its class in its first hundred."""
MAX_FILES = 4096
"""Files of a directory looked at for metadata, the likely names first."""
TAIL_BYTES = 64 * 1024
LOCAL_HEADER = struct.Struct("<4s22xHH")
"""A zip local header: its signature, then (after 22 bytes) the lengths of its name and extra field."""
EOCD = struct.Struct("<4s8xII")
"""The end-of-central-directory record up to the central directory's size and offset."""
ZIP64_LOCATOR_SIZE = 20
ZIP64_RECORD_SIZE = 56


def is_metadata_head(head: bytes) -> bool:
    """Whether ``head`` begins a pickle of a DCP ``Metadata`` (its first global; the opcodes are only read)."""
    import pickletools  # here: only files that are no checkpoint, and directories, are looked at this way

    if not head.startswith(b"\x80"):
        return False
    strings: list[str] = []
    try:
        for opcode, argument, _ in pickletools.genops(head):
            if opcode.name == "GLOBAL":
                return isinstance(argument, str) and argument.replace(" ", ".") in METADATA_CLASSES
            if opcode.name == "STACK_GLOBAL":
                return ".".join(strings[-2:]) in METADATA_CLASSES
            if isinstance(argument, str):
                strings.append(argument)
    except ValueError:  # ``head`` ends mid-pickle, or is not one
        return False
    return False


def is_distcp(source: ByteSource) -> bool:
    """Whether the file is two or more torch.save archives one after another, as a ``.distcp`` holds its items.

    The end records describe the last archive with offsets from its own start:
    that start is past 0, and a torch.save archive begins both there and at 0.
    """
    size = source.size
    tail_start = max(0, size - TAIL_BYTES)
    tail = source.read(tail_start, size - tail_start)
    eocd = tail.rfind(b"PK\x05\x06")
    if eocd < 0 or eocd + EOCD.size > len(tail):
        return False
    _, cd_size, cd_offset = EOCD.unpack_from(tail, eocd)
    locator = eocd - ZIP64_LOCATOR_SIZE
    if locator >= 0 and tail[locator : locator + 4] == b"PK\x06\x07":
        (record_offset,) = struct.unpack_from("<Q", tail, locator + 8)
        record = locator - ZIP64_RECORD_SIZE
        if record < 0 or tail[record : record + 4] != b"PK\x06\x06":
            return False
        start = tail_start + record - record_offset
    else:
        start = tail_start + eocd - cd_offset - cd_size
    return 0 < start < size and _torch_save_at(source, 0) and _torch_save_at(source, start)


def _torch_save_at(source: ByteSource, offset: int) -> bool:
    """Whether a zip local header of a ``<archive>/data.pkl`` record (torch.save writes it first) is at ``offset``."""
    if offset + LOCAL_HEADER.size > source.size:
        return False
    signature, name_length, _ = LOCAL_HEADER.unpack(source.read(offset, LOCAL_HEADER.size))
    if signature != b"PK\x03\x04" or offset + LOCAL_HEADER.size + name_length > source.size:
        return False
    name = source.read(offset + LOCAL_HEADER.size, name_length)
    return name.endswith(b"/data.pkl") and name.count(b"/") == 1
