"""``save_torch(checkpoint, path)``: any checkpoint ckptfs reads, as the zip archive ``torch.save`` writes.

The records are those of torch 2.13, in its order: ``data.pkl`` (``TorchPickler``),
``.format_version``, ``.storage_alignment``, ``byteorder``, ``data/0`` … (the
storages, little-endian, in the order the pickle first refers to them),
``version`` and ``.data/serialization_id``; each framed as torch frames it
(``torch_zip``). Storage bytes stored as they are in a local file are copied
by the kernel, all others (deflated, byte-swapped, gathered from DCP chunks,
remote) a bounded chunk at a time, so memory stays flat whatever the size.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from isal.isal_zlib import crc32

from ckptfs.checkpoint import Checkpoint
from ckptfs.fs.safetensors import LeftOut
from ckptfs.output_files import partial_file, writing
from ckptfs.saving.output import CHUNK, Crc, Output
from ckptfs.saving.torch_pickle import Record, TorchPickler
from ckptfs.saving.torch_zip import Entry, central_directory, descriptor, local_header

_MASK = (1 << 64) - 1


def archive_prefix(path: Path) -> str:
    """The folder name torch gives the records: the file's name without its last suffix (``archive`` if that is
    empty or not ASCII, as when torch is handed a file object)."""
    stem = path.name.rsplit(".", 1)[0] if "." in path.name[1:] else path.name
    return stem if stem and stem.isascii() else "archive"


def save_torch(checkpoint: Checkpoint, path: str | os.PathLike[str],
               committing: Callable[[], None] | None = None) -> list[LeftOut]:
    """Write ``checkpoint`` to ``path`` as ``torch.save`` would have; what it could not hold, by dotted key.

    ``path`` is written as ``path.ckptfs-partial`` beside it, fsynced and renamed (``committing`` runs just
    before: see ``partial_file``); on any error or interrupt before that nothing is left behind."""
    out = Path(path)
    pickler = TorchPickler(checkpoint.root, checkpoint.limits)
    pickle = pickler.dump()
    with partial_file(out, committing) as stream, writing(out), Output(stream) as output:
        TorchArchive(output, archive_prefix(out)).write(checkpoint, pickle, pickler.records)
    return pickler.left_out


class TorchArchive:
    """The records of one archive, written front to back, then its central directory."""

    def __init__(self, output: Output, prefix: str) -> None:
        self.output = output
        self.prefix = prefix
        self.entries: list[Entry] = []
        self.total = 0
        """The storage bytes to write (what a progress line shows against ``output.moved``)."""

    def write(self, checkpoint: Checkpoint, pickle: bytes, records: list[Record]) -> None:
        self.total = sum(record.nbytes for record in records)
        self._small("data.pkl", pickle)
        self._small(".format_version", b"1")
        self._small(".storage_alignment", b"64")
        self._small("byteorder", b"little")
        for record in records:
            entry = self._begin(f"data/{record.key}", record.nbytes)
            crc = Crc()
            _copy_record(checkpoint, record, self.output, crc)
            self._descriptor_behind(entry, crc)
        self.output.crcs.wait()
        self._small("version", b"3\n")
        self._small(".data/serialization_id", self._serialization_id())
        self.output.write(central_directory(self.entries, self.output.position))

    def _begin(self, name: str, size: int) -> Entry:
        entry = Entry(f"{self.prefix}/{name}".encode(), self.output.position, size)
        self.entries.append(entry)
        self.output.write(local_header(entry))
        return entry

    def _descriptor_behind(self, entry: Entry, crc: Crc) -> None:
        """The record's descriptor, written once the CRC-32s behind its copies are done; the copy goes on."""
        position = self.output.reserve(len(descriptor(entry)))

        def write() -> None:
            entry.crc = crc.value
            self.output.write_at(descriptor(entry), position)
        self.output.crcs.submit(write)

    def _small(self, name: str, data: bytes) -> None:
        entry = self._begin(name, len(data))
        entry.crc = crc32(data)
        self.output.write(data)
        self.output.write(descriptor(entry))

    def _serialization_id(self) -> bytes:
        """40 digits as torch writes them: a combined hash of the record names, then one of their CRC-32s."""
        names = crcs = 0
        for entry in self.entries:
            names = _hash_combine(names, crc32(entry.name))
            crcs = _hash_combine(crcs, entry.crc)
        return f"{names:020d}{crcs:020d}".encode()


def _hash_combine(seed: int, value: int) -> int:
    """``c10::hash_combine``, the mix torch uses for the serialization id."""
    return (seed ^ (value + 0x9E3779B9 + (seed << 6) + (seed >> 2))) & _MASK


def _copy_record(checkpoint: Checkpoint, record: Record, output: Output, crc: Crc) -> None:
    """The record's bytes to ``output``, their CRC-32 carried on in ``crc``."""
    extents = checkpoint.extents(record.content)
    if extents is not None and all(extent.source.fileno() is not None for extent in extents):
        for extent in extents:
            fd = extent.source.fileno()
            assert fd is not None
            output.copy(fd, extent.offset, extent.length, crc)
        return
    for start in range(0, record.nbytes, CHUNK):
        data = checkpoint.read(record.content, start, min(CHUNK, record.nbytes - start))
        crc.add(data)
        output.write(data)
        output.moved += len(data)
