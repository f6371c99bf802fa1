"""Which tensors of a ``torch.save`` zip can be written in place: those whose logical bytes are one range of a stored
record, as they are stored, that no other tensor reads differently."""

from __future__ import annotations

from dataclasses import dataclass

from ckptfs.formats.interface import ParsedCheckpoint
from ckptfs.formats.zip_checkpoint import ZipParsed
from ckptfs.model.records import Storage, Tensor
from ckptfs.sources import ByteSource, LocalFileSource


@dataclass(frozen=True, slots=True)
class Target:
    """Where a writable tensor's logical bytes are: ``length`` bytes from byte ``start`` of its storage."""

    storage: Storage
    start: int
    length: int


def refusal_of_archive(parsed: ParsedCheckpoint, source: ByteSource) -> str | None:
    """Why this checkpoint cannot be opened for writing at all, or None."""
    if parsed.format == "torchscript":
        return "a TorchScript archive: only torch.save zip archives are written in place"
    if parsed.format == "legacy" or parsed.format == "tar":
        return "a legacy (torch < 1.6) file: only torch.save zip archives are written in place"
    if parsed.format == "dcp":
        return "a DCP checkpoint: only torch.save zip archives are written in place"
    if parsed.format != "zip" or not isinstance(parsed, ZipParsed) or parsed.archive.source is not source:
        return f"a {parsed.format} checkpoint: only torch.save zip archives are written in place"
    if type(source) is not LocalFileSource:
        return "not a local file (a URL or a file object): only a local file is written in place"
    if parsed.byteorder != "little":
        return "a big-endian archive: its tensors' files are byte-swapped, not the bytes as stored"
    if any(storage.compressed for storage in parsed.storages):
        return "a deflated archive (re-zipped): its records are not stored as they are"
    return None


class Targets:
    """Each tensor's ``Target``, or why it is read-only, worked out on first use (per storage)."""

    def __init__(self, tensors: list[Tensor]) -> None:
        self._by_storage: dict[int, list[Tensor]] = {}
        self._found: dict[int, Target | str] = {}
        for tensor in tensors:
            if tensor.storage is not None:
                self._by_storage.setdefault(id(tensor.storage), []).append(tensor)

    def of(self, tensor: Tensor) -> Target | str:
        """The tensor's target, or the reason it is read-only (worked out once: every write asks)."""
        found = self._found.get(id(tensor))
        if found is None:
            found = self._found[id(tensor)] = self._work_out(tensor)
        return found

    def _work_out(self, tensor: Tensor) -> Target | str:
        storage = tensor.storage
        if tensor.kind != "dense" or storage is None:
            return "it has no stored bytes"
        if storage.inline_data is not None or storage.source is None or storage.offset < 0:
            return "its bytes are not a record of the archive"
        if storage.compressed:
            return "its record is deflated"
        if storage.byteorder != "little":
            return "it is big-endian"
        if not tensor.is_contiguous:
            return "it is not contiguous (its file is gathered from strided bytes)"
        if tensor.conj or tensor.neg or tensor.quantization is not None:
            return "its file is not its bytes as stored (conjugate, negative or quantized)"
        start, length = _range(tensor)
        if start < 0 or start + length > storage.nbytes:
            return "its bytes run outside its storage"
        for other in self._by_storage.get(id(storage), ()):
            if other is tensor or other.kind != "dense":
                continue
            other_start, other_length = _range(other)
            overlaps = other_start < start + length and start < other_start + other_length
            if overlaps and (other_start, other_length) != (start, length):
                return "another tensor views part of its bytes differently"
        return Target(storage, start, length)


def _range(tensor: Tensor) -> tuple[int, int]:
    return tensor.storage_offset * tensor.itemsize, tensor.nbytes
