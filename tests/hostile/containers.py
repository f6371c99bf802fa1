"""Wrap hand-made pickles into checkpoint containers (zip and legacy stream)."""

from __future__ import annotations

import io
import struct
import zipfile

from hostile.picklegen import BINPERSID, dct, glob, i, lst, pickle, s, tup

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


def zip_checkpoint(data_pkl: bytes, records: dict[str, bytes] | None = None, prefix: str = "archive",
                   byteorder: bytes | None = b"little") -> bytes:
    """A stored zip holding ``data.pkl``, optional ``byteorder`` and ``data/<key>`` records."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as z:
        z.writestr(f"{prefix}/data.pkl", data_pkl)
        if byteorder is not None:
            z.writestr(f"{prefix}/byteorder", byteorder)
        for key, data in (records or {}).items():
            z.writestr(f"{prefix}/data/{key}", data)
        z.writestr(f"{prefix}/version", b"3\n")
    return buffer.getvalue()


def legacy_checkpoint(main_pkl: bytes, storages: list[tuple[str, int, bytes]] = (),
                      magic: int = LEGACY_MAGIC, protocol: int = 1001, little_endian: bytes = b"\x88") -> bytes:
    """The legacy stream: magic, protocol, sys_info, ``main_pkl``, key list, then (key, count, bytes)."""
    sys_info = dct((s("protocol_version"), i(1001)), (s("little_endian"), little_endian),
                   (s("type_sizes"), dct((s("short"), i(2)), (s("int"), i(4)), (s("long"), i(4)))))
    parts = [pickle(i(magic)), pickle(i(protocol)), pickle(sys_info), main_pkl,
             pickle(lst(*(s(key) for key, _, _ in storages)))]
    parts += [struct.pack("<q", count) + data for _, count, data in storages]
    return b"".join(parts)


def legacy_pid(cls: str, key: str, numel: int, view: bytes = b"N") -> bytes:
    """A legacy ``('storage', cls, key, location, numel, view)`` persistent id, loaded."""
    return tup(s("storage"), glob("torch", cls), s(key), s("cpu"), i(numel), view) + BINPERSID
