"""A tiny pickle assembler: opcodes as bytes, for building hostile streams by hand.

Helpers return the bytes that push one value; ``pickle`` wraps a body with PROTO
and STOP. Nothing here imports or calls what the stream names.
"""

from __future__ import annotations

import struct

MARK = b"("
STOP = b"."
POP = b"0"
DUP = b"2"
NONE = b"N"
EMPTY_LIST = b"]"
EMPTY_DICT = b"}"
EMPTY_TUPLE = b")"
EMPTY_SET = b"\x8f"
APPEND = b"a"
APPENDS = b"e"
SETITEM = b"s"
SETITEMS = b"u"
ADDITEMS = b"\x90"
TUPLE = b"t"
TUPLE1 = b"\x85"
TUPLE2 = b"\x86"
TUPLE3 = b"\x87"
LIST = b"l"
DICT = b"d"
FROZENSET = b"\x91"
REDUCE = b"R"
BUILD = b"b"
NEWOBJ = b"\x81"
NEWOBJ_EX = b"\x92"
OBJ = b"o"
STACK_GLOBAL = b"\x93"
MEMOIZE = b"\x94"
BINPERSID = b"Q"


def pickle(body: bytes, proto: int = 2) -> bytes:
    return (bytes([0x80, proto]) if proto >= 2 else b"") + body + STOP


def glob(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def stack_glob(module: str, name: str) -> bytes:
    return s(module) + s(name) + STACK_GLOBAL


def s(text: str) -> bytes:
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) < 256:
        return b"\x8c" + bytes([len(raw)]) + raw
    return b"X" + struct.pack("<I", len(raw)) + raw


def text_string(text: str) -> bytes:
    """Protocol-0 ``STRING`` (quoted repr)."""
    return b"S" + repr(text).encode() + b"\n"


def b(data: bytes) -> bytes:
    return b"C" + bytes([len(data)]) + data if len(data) < 256 else b"B" + struct.pack("<I", len(data)) + data


def i(n: int) -> bytes:
    if 0 <= n < 256:
        return b"K" + bytes([n])
    if 0 <= n < 65536:
        return b"M" + struct.pack("<H", n)
    if -(2**31) <= n < 2**31:
        return b"J" + struct.pack("<i", n)
    raw = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    if len(raw) < 256:
        return b"\x8a" + bytes([len(raw)]) + raw
    return b"\x8b" + struct.pack("<i", len(raw)) + raw


def put(index: int) -> bytes:
    return b"q" + bytes([index]) if index < 256 else b"r" + struct.pack("<I", index)


def get(index: int) -> bytes:
    return b"h" + bytes([index]) if index < 256 else b"j" + struct.pack("<I", index)


def tup(*items: bytes) -> bytes:
    return MARK + b"".join(items) + TUPLE


def lst(*items: bytes) -> bytes:
    return EMPTY_LIST + (MARK + b"".join(items) + APPENDS if items else b"")


def dct(*pairs: tuple[bytes, bytes]) -> bytes:
    return EMPTY_DICT + (MARK + b"".join(k + v for k, v in pairs) + SETITEMS if pairs else b"")


def call(func: bytes, *args: bytes) -> bytes:
    """``func(*args)`` through REDUCE."""
    return func + tup(*args) + REDUCE


def storage_pid(cls: str, key: str, numel: int, location: str = "cpu") -> bytes:
    """A zip-style ``('storage', cls, key, location, numel)`` persistent id, loaded."""
    return tup(s("storage"), glob("torch", cls), s(key), s(location), i(numel)) + BINPERSID


def tensor_v2(storage: bytes, offset: bytes, size: bytes, stride: bytes) -> bytes:
    """``torch._utils._rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict())``."""
    return call(glob("torch._utils", "_rebuild_tensor_v2"), storage, offset, size, stride, b"\x89",
                call(glob("collections", "OrderedDict")))


def ints(*values: int) -> bytes:
    return tup(*(i(v) for v in values))
