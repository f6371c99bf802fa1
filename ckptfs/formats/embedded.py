"""torch.save archives stored as records of another zip (a ``.pt2``'s pickled payloads and legacy files)."""

from __future__ import annotations

from ckptfs.errors import CkptfsError, UnsupportedError
from ckptfs.formats.interface import ParsedCheckpoint
from ckptfs.formats.prefetch import Prefetch
from ckptfs.formats.zip_archive import STORED, ZipArchive, ZipEntry
from ckptfs.formats.zip_checkpoint import open_zip
from ckptfs.limits import Limits
from ckptfs.sources.window import WindowSource


def open_embedded(archive: ZipArchive, entry: ZipEntry, limits: Limits) -> ParsedCheckpoint:
    """The torch.save archive held by ``entry`` (stored; its data offset resolved), its storages moved onto
    ``archive``'s source: their offsets absolute, readable (and served zero-copy) like the outer archive's own.
    Each storage's local header is checked here (one small read each), as the outer archive cannot later."""
    name = entry.name[len(archive.prefix):]
    if entry.method != STORED:
        raise UnsupportedError(f"record {name!r} holds a torch.save archive compressed with method {entry.method}; "
                               "ckptfs reads stored ones")
    window = WindowSource(archive.source, entry.data_offset, entry.size, f"{archive.source.name}:{name}")
    try:
        parsed = open_zip(Prefetch(window), limits)
        for storage in parsed.storages:
            if storage.compressed:
                raise UnsupportedError(f"storage record {storage.record!r} is deflated")
            parsed.verify(storage)
    except CkptfsError as exc:
        raise type(exc)(f"record {name!r} (a torch.save archive): {exc.reason}") from None
    for storage in parsed.storages:
        storage.offset += entry.data_offset
        storage.source = archive.source
        storage.record = f"{name}/{storage.record}"
    return parsed
