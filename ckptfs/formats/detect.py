"""Recognises a checkpoint's format by its content, never by its file name; names what other files are.

The tail is read first (``Prefetch``): a zip's end record there opens the
archive without reading the head (a zip's head is among its records, read
next anyway). Otherwise, or when that zip does not open and the file does not
start like one, formats are tried from one table of probes on the head
(``FORMATS``): a new format is a module with an ``open(opening, limits) ->
ParsedCheckpoint`` and a row here.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from ckptfs.errors import (
    CkptfsError,
    CorruptCheckpointError,
    NotACheckpointError,
    UnsupportedError,
)
from ckptfs.formats import dcp, legacy, legacy_tar, pt2, safetensors_file, zip_checkpoint
from ckptfs.formats.interface import ParsedCheckpoint
from ckptfs.formats.prefetch import Prefetch
from ckptfs.formats.zip_archive import LOCAL_SIG, ends_with_records
from ckptfs.limits import Limits
from ckptfs.sources import ByteSource, SourceSet

HEAD_BYTES = legacy.FIRST_WINDOW
"""The head read when the tail holds no zip end record: the legacy reader's first window of its pickles."""
COMPRESSED = [(b"\x1f\x8b", "gzip"), *((b"BZh%c" % level, "bzip2") for level in b"123456789"),
              (b"\xfd7zXZ\x00", "xz"), (b"\x28\xb5\x2f\xfd", "zstd"), (b"\x04\x22\x4d\x18", "lz4")]
"""Magic numbers of compressed files (a checkpoint compressed whole must be decompressed to be read)."""


class Format(NamedTuple):
    name: str
    probe: Callable[[Prefetch, bytes, Limits], bool]
    """Whether the source, whose head is given, is this format's."""
    open: Callable[[Prefetch, Limits], ParsedCheckpoint]


def open_parsed(source: ByteSource, limits: Limits) -> ParsedCheckpoint:
    """The source's checkpoint, by content; a set of sources (a directory) is a checkpoint of several files."""
    if isinstance(source, SourceSet):
        from ckptfs.formats import dcp_directory, hf_directory  # here: directories' formats, which a file does without

        if not dcp_directory.metadata_files(source):
            members = hf_directory.safetensors_members(source)
            if hf_directory.is_safetensors_directory(source, members):
                return hf_directory.open_safetensors_directory(source, members, limits)
        return dcp_directory.open_dcp(source, limits)
    if source.size == 0:
        raise NotACheckpointError("empty file, not a PyTorch checkpoint")
    opening = Prefetch(source)
    if ends_with_records(opening.tail):
        try:
            return _open_zip(opening, limits)
        except CkptfsError:
            if opening.head(len(LOCAL_SIG)) == LOCAL_SIG:
                raise
    head = opening.head(HEAD_BYTES)
    for candidate in FORMATS:
        if candidate.probe(opening, head, limits):
            return candidate.open(opening, limits)
    raise _not_a_checkpoint(head)


def _open_zip(opening: Prefetch, limits: Limits) -> ParsedCheckpoint:
    """A torch.save or TorchScript archive, or a torch.export archive (by its records), from one parse of the
    central directory; a zip that is none of them may be one file of a DCP directory."""
    try:
        archive = pt2.Pt2Zip(opening, limits)
        if pt2.is_pt2(archive):
            return pt2.open_pt2(archive, limits)
        return zip_checkpoint.open_archive(archive, limits)
    except (CorruptCheckpointError, NotACheckpointError, UnsupportedError):
        if dcp.is_distcp(opening.source):
            raise NotACheckpointError(dcp.DISTCP_FILE) from None
        raise


FORMATS = (
    Format("zip", zip_checkpoint.probe, _open_zip),
    Format("tar", legacy_tar.probe, legacy_tar.open_tar),
    Format("safetensors", safetensors_file.probe, safetensors_file.open_safetensors),
    Format("legacy", legacy.probe, legacy.open_legacy),
)
"""Tried in order; zip covers torch.save archives, TorchScript and torch.export (.pt2) archives; tar, torch ≤ 0.3's
checkpoints; safetensors, the files ``ckptfs convert`` writes (so that ``diff`` compares a checkpoint with one)."""


def _not_a_checkpoint(head: bytes) -> Exception:
    if head.startswith(b"PK\x05\x06"):
        return NotACheckpointError("an empty zip archive, not a PyTorch checkpoint")
    for magic, name in COMPRESSED:
        if head.startswith(magic):
            return NotACheckpointError(f"{name}-compressed; decompress it first")
    if head.startswith(b"PYTORCH1"):
        return UnsupportedError("a pre-1.0 preview checkpoint (PYTORCH1), which torch itself refuses")
    if head.startswith(b"GGUF"):
        return NotACheckpointError("a GGUF file, not a PyTorch checkpoint")
    if head.startswith(b"\x93NUMPY"):
        return NotACheckpointError("a numpy .npy file, not a PyTorch checkpoint")
    if head.startswith(b"\x89HDF"):
        return NotACheckpointError("an HDF5 file, not a PyTorch checkpoint")
    if len(head) >= 2 and head[0] == 0x80:
        return NotACheckpointError(f"a pickle of protocol {head[1]}, not a torch.save checkpoint")
    return NotACheckpointError(f"not a PyTorch checkpoint (starts with bytes {head[:8].hex(' ')})")
