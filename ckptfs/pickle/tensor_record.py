"""One step for the ~28 opcodes torch's pickler writes for each tensor of a state dict.

``torch.save`` pickles a tensor as ``_rebuild_tensor_v2(storage, offset, size,
stride, requires_grad, OrderedDict())`` with the storage as a persistent id
``('storage', StorageClass, key, location, numel[, None])``. In bytes, after
the rebuild function is pushed::

    ( ( 'storage' StorageClass key location numel [None] t PUT Q
        offset size stride NEWFALSE|NEWTRUE OrderedDict ) R PUT t PUT R PUT

where each string and class is either a memo get or the literal and its PUT,
numbers are BININT1/2/BININT, and the tuples are EMPTY_TUPLE, TUPLE1-3 or MARK
… TUPLE followed by a PUT. ``SafeUnpickler`` matches this with one regular
expression and ``apply`` does what the opcodes would do, in their order
(memo writes, the persistent load, both calls), so the result and every
error are the same. Anything else, including a get of a key not yet in the
memo or a string whose declared length disagrees, is left to the opcodes.
"""

from __future__ import annotations

import re
import struct
from typing import Any

from ckptfs.pickle.machine import Machine

_GET = rb"(h.|j....)"
_PUT = rb"(q.|r....)"
_STR = rb"(?:" + _GET + rb"|X(.)\x00\x00\x00([\x20-\x7e]{0,255}?)" + _PUT + rb")"
_CLASS = rb"(?:" + _GET + rb"|c([A-Za-z0-9_.]{1,200})\n([A-Za-z0-9_]{1,200})\n" + _PUT + rb")"
_INT = rb"(K.|M..|J....)"
_INTS = rb"(?:K.|M..|J....)"
_TUPLE = rb"(\)|" + _INTS + rb"{1,3}[\x85-\x87]|\(" + _INTS + rb"{0,64}t)" + _PUT + rb"?"

PATTERN = re.compile(
    rb"\(\(" + _STR + _CLASS + _STR + _STR + _INT + rb"(N?)t" + _PUT + rb"Q"
    + _INT + _TUPLE + _TUPLE + rb"([\x88\x89])" + _CLASS + rb"\)R" + _PUT + rb"t" + _PUT + rb"R" + _PUT,
    re.DOTALL,
)
"""Groups: each string and class is (get, …, put), each PUT or GET its whole opcode."""
MAX_PUTS = 11
MAX_PUSHES = 16
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_TUPLE_OPS = {0x85: 1, 0x86: 2, 0x87: 3}
_ABSENT = object()
MAX_TUPLES = 4096
_TUPLES: dict[bytes, list[int]] = {}
"""Sizes and strides by their opcodes, read once: a checkpoint has few distinct shapes."""


class _Fallback(Exception):
    """The bytes are not the plain form: the opcodes will read them."""


def apply(u: Machine, match: re.Match[bytes]) -> bool:
    """Does what the record's opcodes do; False (nothing done) when they should run instead."""
    stack, limits, memo = u.stack, u.limits, u.memo
    # Near a limit the opcodes run, so that limit errors come in their order.
    if (not stack or len(u.metastack) + 2 > limits.max_stack_depth or limits.max_stack_depth < MAX_PUSHES
            or len(memo) + MAX_PUTS > limits.max_memo_entries):
        return False
    g = match.groups()
    undo: list[tuple[int, Any]] = []
    try:
        # Memo reads and writes in opcode order, before any call; should the opcodes have to run
        # instead after all, the memo is put back as it was.
        tag = _string(memo, g, 0, undo)
        cls = _class(u, g, 4, undo)
        key = _string(memo, g, 8, undo)
        location = _string(memo, g, 12, undo)
        numel = _int(g[16])
        pid = (tag, cls, key, location, numel, None) if g[17] else (tag, cls, key, location, numel)
        _put(memo, g[18], pid, undo)
        size = _tuple(memo, g[20], g[21], undo)
        stride = _tuple(memo, g[22], g[23], undo)
        ordered_dict = _class(u, g, 25, undo)
    except _Fallback:
        while undo:
            index, old = undo.pop()
            if old is _ABSENT:
                del memo[index]
            else:
                memo[index] = old
        return False
    storage = u.persistent_load(pid)
    offset = _int(g[19])
    requires_grad = g[24] == b"\x88"
    metadata = u.call(ordered_dict, ())
    memo[_index(g[29])] = metadata
    args = (storage, offset, size, stride, requires_grad, metadata)
    memo[_index(g[30])] = args
    result = u.call(stack.pop(), args)
    memo[_index(g[31])] = result
    stack.append(result)
    u.pos = match.end()
    return True


def _index(op: bytes) -> int:
    """The memo index of a BINPUT/BINGET (``q.``, ``h.``) or LONG_BINPUT/LONG_BINGET opcode."""
    return op[1] if len(op) == 2 else _U32.unpack_from(op, 1)[0]


def _get(memo: dict[int, Any], op: bytes) -> Any:
    try:
        return memo[_index(op)]
    except KeyError:
        raise _Fallback from None


def _put(memo: dict[int, Any], op: bytes | None, value: Any, undo: list[tuple[int, Any]]) -> None:
    """The memo write of a PUT opcode, if there is one (``apply`` checked there is room: no limit check)."""
    if op is None:
        return
    index = _index(op)
    undo.append((index, memo.get(index, _ABSENT)))
    memo[index] = value


def _string(memo: dict[int, Any], g: tuple[Any, ...], at: int, undo: list[tuple[int, Any]]) -> Any:
    if g[at] is not None:
        return _get(memo, g[at])
    length, text = g[at + 1], g[at + 2]
    if length[0] != len(text):
        raise _Fallback
    value = text.decode("ascii")
    _put(memo, g[at + 3], value, undo)
    return value


def _class(u: Machine, g: tuple[Any, ...], at: int, undo: list[tuple[int, Any]]) -> Any:
    if g[at] is not None:
        return _get(u.memo, g[at])
    value = u.find_global(g[at + 1].decode("ascii"), g[at + 2].decode("ascii"))
    _put(u.memo, g[at + 3], value, undo)
    return value


def _int(raw: bytes) -> int:
    op = raw[0]
    if op == 0x4B:
        return raw[1]
    if op == 0x4D:
        return raw[1] | raw[2] << 8
    return _I32.unpack_from(raw, 1)[0]


def _tuple(memo: dict[int, Any], raw: bytes, put: bytes | None, undo: list[tuple[int, Any]]) -> tuple[int, ...]:
    items = _TUPLES.get(raw)
    if items is None:
        items = list(_parse_tuple(raw))
        if len(_TUPLES) < MAX_TUPLES:
            _TUPLES[raw] = items
    value = tuple(items)  # a tuple of its own, as the opcodes make: the tree tells shared tuples apart
    _put(memo, put, value, undo)
    return value


def _parse_tuple(raw: bytes) -> tuple[int, ...]:
    if raw == b")":
        return ()
    if raw[0] == 0x28:
        body, count = raw[1:-1], -1
    else:
        body, count = raw[:-1], _TUPLE_OPS[raw[-1]]
    if body[::2] == b"K" * (len(body) // 2) and len(body) % 2 == 0:
        value = tuple(body[1::2])  # all BININT1: every other byte is a value
    else:
        value = tuple(_ints(body))
    if count >= 0 and len(value) != count:
        raise _Fallback
    return value


def _ints(body: bytes) -> list[int]:
    values = []
    pos = 0
    while pos < len(body):
        width = 2 if body[pos] == 0x4B else 3 if body[pos] == 0x4D else 5
        values.append(_int(body[pos : pos + width]))
        pos += width
    return values
