"""Recognises a checkpoint's format by its content, never by its file name; names what other files are."""

from __future__ import annotations

from typing import Any

from ckptfs.errors import (
    CkptfsError,
    CorruptCheckpointError,
    NotACheckpointError,
    TruncatedPickleError,
    UnsupportedError,
)
from ckptfs.formats import dcp
from ckptfs.formats.legacy import open_legacy
from ckptfs.formats.parsed import ParsedCheckpoint
from ckptfs.formats.zip_checkpoint import open_zip
from ckptfs.limits import Limits
from ckptfs.sources import ByteSource
from ckptfs.unpickle import SafeUnpickler

SNIFF_BYTES = 512
PICKLE_SNIFF_BYTES = 64 * 1024
"""A pickle without a PROTO opcode (protocols 0 and 1) is recognised by reading its first pickle this far."""
OLD_PICKLE_FIRST_OPCODES = frozenset(b"(NIJKMLFGSTUVX]})cP")
"""Opcodes of protocols 0 and 1 that can begin a pickle."""
COMPRESSED = [(b"\x1f\x8b", "gzip"), *((b"BZh%c" % level, "bzip2") for level in b"123456789"),
              (b"\xfd7zXZ\x00", "xz"), (b"\x28\xb5\x2f\xfd", "zstd"), (b"\x04\x22\x4d\x18", "lz4")]
"""Magic numbers of compressed files (a checkpoint compressed whole must be decompressed to be read)."""


def open_parsed(source: ByteSource, limits: Limits) -> ParsedCheckpoint:
    head = source.read(0, min(source.size, SNIFF_BYTES))
    if not head:
        raise NotACheckpointError("empty file, not a PyTorch checkpoint")
    if head.startswith(b"PK\x03\x04"):
        try:
            return open_zip(source, limits)
        except (CorruptCheckpointError, NotACheckpointError):
            if dcp.is_distcp(source):
                raise NotACheckpointError(dcp.DISTCP_FILE) from None
            raise
    if head.startswith(b"PK\x05\x06"):
        raise NotACheckpointError("an empty zip archive, not a PyTorch checkpoint")
    if _starts_a_pickle(source, head, limits):
        return open_legacy(source, limits)
    raise _not_a_checkpoint(head)


def directory_error(path: str) -> CkptfsError:
    """What to say when given a directory: a DCP checkpoint's (by a file's content) or any other."""
    if dcp.holds_metadata(path):
        return UnsupportedError(dcp.DIRECTORY, path)
    return NotACheckpointError("a directory, not a checkpoint file", path)


def _starts_a_pickle(source: ByteSource, head: bytes, limits: Limits) -> bool:
    """Whether the file starts with a pickle this reader reads: protocols 2–5 by their PROTO opcode, 0 and 1 by
    reading the first pickle (a text file fails within a few bytes)."""
    if head[0] == 0x80:
        return len(head) >= 2 and head[1] <= 5
    if head[0] not in OLD_PICKLE_FIRST_OPCODES:
        return False
    window = source.read(0, min(source.size, PICKLE_SNIFF_BYTES, limits.max_pickle_bytes))
    try:
        SafeUnpickler(window, persistent_load=_any_persistent_id, limits=limits).load()
    except TruncatedPickleError:
        return len(window) < source.size
    except CkptfsError:
        return False
    return True


def _any_persistent_id(pid: Any) -> None:
    return None


def _not_a_checkpoint(head: bytes) -> Exception:
    for magic, name in COMPRESSED:
        if head.startswith(magic):
            return NotACheckpointError(f"{name}-compressed; decompress it first")
    if head.startswith(b"PYTORCH1"):
        return UnsupportedError("a pre-1.0 preview checkpoint (PYTORCH1), which torch itself refuses")
    if len(head) > 262 and head[257:262] == b"ustar":
        return UnsupportedError("a tar archive: TAR-format checkpoints of torch ≤ 0.3 are not supported")
    if len(head) >= 9 and int.from_bytes(head[:8], "little") < (1 << 30) and head[8:9] == b"{":
        return NotACheckpointError("a safetensors file, not a PyTorch checkpoint")
    if head.startswith(b"GGUF"):
        return NotACheckpointError("a GGUF file, not a PyTorch checkpoint")
    if head.startswith(b"\x93NUMPY"):
        return NotACheckpointError("a numpy .npy file, not a PyTorch checkpoint")
    if head.startswith(b"\x89HDF"):
        return NotACheckpointError("an HDF5 file, not a PyTorch checkpoint")
    if len(head) >= 2 and head[0] == 0x80:
        return NotACheckpointError(f"a pickle of protocol {head[1]}, not a torch.save checkpoint")
    return NotACheckpointError(f"not a PyTorch checkpoint (starts with bytes {head[:8].hex(' ')})")
