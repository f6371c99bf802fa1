"""A reference floor for reading a checkpoint's pickle in Python: ``python pickle_floor.py CHECKPOINT``.

The benchmark times this whole process (interpreter start included) beside ``ckptfs mount``.
It reads the pickles with the standard library's C unpickler, whose ``find_class``
and ``persistent_load`` return placeholders (nothing is imported; every call makes
a tuple): the least a Python program spends to start and go through the
opcodes, before it has checked anything or made a single record of its own.
Prints the number of objects at the root.
"""

from __future__ import annotations

import io
import pickle
import struct
import sys

LOCAL_HEADER = struct.Struct("<4s4xH16xHH")
"""A zip local file header: signature, compression method, name and extra field lengths."""
LEGACY_PICKLES = 5
"""A legacy file: magic number, protocol version, system info, the object, the storage keys."""


class _Placeholder:
    """What every global becomes: calling it (REDUCE, NEWOBJ) gives back the arguments."""

    def __call__(self, *args: object) -> tuple[object, ...]:
        return args


class _FloorUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> object:
        return _Placeholder()

    def persistent_load(self, pid: object) -> object:
        return pid


def root_of(path: str) -> object:
    with open(path, "rb") as f:
        head = f.read(LOCAL_HEADER.size)
        if head[:4] != b"PK\x03\x04":
            f.seek(0)
            return [_FloorUnpickler(f).load() for _ in range(LEGACY_PICKLES)][3]
        # torch.save writes data.pkl first and stored: the unpickler reads on from its first byte to its STOP.
        _, method, name_length, extra_length = LOCAL_HEADER.unpack(head)
        if method != 0 or not f.read(name_length).endswith(b"data.pkl"):
            raise SystemExit(f"{path}: the first record is not a stored data.pkl")
        f.seek(extra_length, io.SEEK_CUR)
        return _FloorUnpickler(f).load()


if __name__ == "__main__":
    print(len(root_of(sys.argv[1])))
