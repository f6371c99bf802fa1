"""Recognises a checkpoint's format by its content, never by its file name, from one table of probes.

A new format is a module with an ``open(source, limits) -> ParsedCheckpoint``
and a row in ``FORMATS``: its name and a probe of the source's first bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ckptfs.errors import NotACheckpointError, UnsupportedError
from ckptfs.formats import legacy, zip_checkpoint
from ckptfs.formats.parsed import ParsedCheckpoint
from ckptfs.limits import Limits
from ckptfs.sources import ByteSource

SNIFF_BYTES = 512


@dataclass(frozen=True, slots=True)
class Format:
    name: str
    probe: Callable[[bytes], bool]
    """True when the first ``SNIFF_BYTES`` of the source (fewer if it is shorter) are this format's."""
    open: Callable[[ByteSource, Limits], ParsedCheckpoint]


FORMATS = (
    Format("zip", zip_checkpoint.probe, zip_checkpoint.open_zip),
    Format("legacy", legacy.probe, legacy.open_legacy),
)
"""Tried in order; zip covers torch.save archives and TorchScript."""


def open_parsed(source: ByteSource, limits: Limits) -> ParsedCheckpoint:
    head = source.read(0, min(source.size, SNIFF_BYTES))
    if not head:
        raise NotACheckpointError("empty file, not a PyTorch checkpoint")
    for candidate in FORMATS:
        if candidate.probe(head):
            return candidate.open(source, limits)
    raise _not_a_checkpoint(head)


def _not_a_checkpoint(head: bytes) -> Exception:
    if head.startswith(b"PK\x05\x06"):
        return NotACheckpointError("an empty zip archive, not a PyTorch checkpoint")
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
