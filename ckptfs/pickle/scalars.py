"""Opcodes that push one scalar read from the stream: integers, floats, strings, bytes."""

from __future__ import annotations

import codecs
import struct
from typing import Callable

from ckptfs.errors import UnpicklingError
from ckptfs.pickle.machine import MAX_LONG_BYTES, Machine


def _int(u: Machine) -> None:
    line = u.read_line()
    if line == b"00":
        u.push(False)
    elif line == b"01":
        u.push(True)
    else:
        u.push(parse_int(line, u))


def parse_int(text: bytes, u: Machine) -> int:
    try:
        return int(text.rstrip(b"L"))
    except ValueError as exc:
        raise UnpicklingError(f"bad integer literal at offset {u.pos}: {exc}") from None


def _long(u: Machine) -> None:
    u.push(parse_int(u.read_line(), u))


def _binint(u: Machine) -> None:
    u.push(struct.unpack("<i", u.take(4))[0])


def _binint1(u: Machine) -> None:
    u.push(u.u8())


def _binint2(u: Machine) -> None:
    u.push(u.u16())


def _long1(u: Machine) -> None:
    u.push(int.from_bytes(u.take(u.u8()), "little", signed=True))


def _long4(u: Machine) -> None:
    n = struct.unpack("<i", u.take(4))[0]
    if n < 0:
        raise UnpicklingError("LONG4 with a negative byte count")
    if n > MAX_LONG_BYTES:
        raise UnpicklingError(f"LONG4 integer of {n} bytes (limit {MAX_LONG_BYTES}: Python's 4300-digit int limit)")
    u.push(int.from_bytes(u.take(n), "little", signed=True))


def _float(u: Machine) -> None:
    try:
        u.push(float(u.read_line()))
    except ValueError:
        raise UnpicklingError(f"bad float literal at offset {u.pos}") from None


def _binfloat(u: Machine) -> None:
    u.push(struct.unpack(">d", u.take(8))[0])


def _string(u: Machine) -> None:
    raw = u.read_line()
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[:1] in (b"'", b'"'):
        raw = raw[1:-1]
    else:
        raise UnpicklingError(f"STRING opcode argument must be quoted at offset {u.pos}")
    try:
        decoded = codecs.escape_decode(raw)[0]
    except ValueError:
        raise UnpicklingError(f"bad STRING escape at offset {u.pos}") from None
    u.push(u.decode_str(decoded))


def _binstring(u: Machine) -> None:
    n = struct.unpack("<i", u.take(4))[0]
    if n < 0:
        raise UnpicklingError("BINSTRING with a negative length")
    u.push(u.decode_str(u.take(n)))


def _short_binstring(u: Machine) -> None:
    u.push(u.decode_str(u.take(u.u8())))


def unicode_text(raw: bytes, u: Machine, codec: str) -> str:
    try:
        return raw.decode(codec, "surrogatepass")
    except UnicodeDecodeError:
        raise UnpicklingError(f"invalid string encoding near offset {u.pos}") from None


def _unicode(u: Machine) -> None:
    u.push(unicode_text(u.read_line(), u, "raw-unicode-escape"))


def _binunicode(u: Machine) -> None:
    u.push(unicode_text(u.take(u.u32()), u, "utf-8"))


def _short_binunicode(u: Machine) -> None:
    u.push(unicode_text(u.take(u.u8()), u, "utf-8"))


def _binunicode8(u: Machine) -> None:
    u.push(unicode_text(u.take(u.u64()), u, "utf-8"))


def _binbytes(u: Machine) -> None:
    u.push(u.take(u.u32()))


def _short_binbytes(u: Machine) -> None:
    u.push(u.take(u.u8()))


def _binbytes8(u: Machine) -> None:
    u.push(u.take(u.u64()))


def _bytearray8(u: Machine) -> None:
    u.push(bytearray(u.take(u.u64())))


SCALAR_OPCODES: dict[int, Callable[[Machine], None]] = {
    ord("I"): _int,
    ord("L"): _long,
    ord("J"): _binint,
    ord("K"): _binint1,
    ord("M"): _binint2,
    0x8A: _long1,
    0x8B: _long4,
    ord("F"): _float,
    ord("G"): _binfloat,
    ord("S"): _string,
    ord("T"): _binstring,
    ord("U"): _short_binstring,
    ord("V"): _unicode,
    ord("X"): _binunicode,
    0x8C: _short_binunicode,
    0x8D: _binunicode8,
    ord("B"): _binbytes,
    ord("C"): _short_binbytes,
    0x8E: _binbytes8,
    0x96: _bytearray8,
}
