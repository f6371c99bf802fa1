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
MAX_TUPLES = 4096
_TUPLES: dict[bytes, list[int]] = {}
"""Sizes and strides by their opcodes, read once: a checkpoint has few distinct shapes."""


class _Fallback(Exception):
    """The bytes are not the plain form: the opcodes will read them."""


def apply(u: Machine, match: re.Match[bytes]) -> bool:
    """Does what the record's opcodes do; False (nothing done) when they should run instead.

    Longer than 60 lines on purpose: it runs once per tensor of a checkpoint, and its memo reads and writes
    stay inline in opcode order (a helper call per string costs as much as the rest of the record). What
    decides whether it runs at all is ``_plain_tuples``.
    """
    stack, limits, memo = u.stack, u.limits, u.memo
    unpack = _U32.unpack_from
    # Near a limit the opcodes run, so that limit errors come in their order.
    if (not stack or len(u.metastack) + 2 > limits.max_stack_depth or limits.max_stack_depth < MAX_PUSHES
            or len(memo) + MAX_PUTS > limits.max_memo_entries):
        return False
    groups = match.groups()
    tuples = _plain_tuples(memo, groups)
    if tuples is None:
        return False
    size_items, stride_items = tuples
    (tag_get, _, tag_text, tag_put, cls_get, cls_module, cls_name, cls_put,
     key_get, _, key_text, key_put, location_get, _, location_text, location_put,
     numel_op, view, pid_put, offset_op, _, size_put, _, stride_put, grad,
     od_get, od_module, od_name, od_put, metadata_put, args_put, result_put) = groups
    # The memo reads and writes, in opcode order (a memo index is ``op[1]`` of a BINGET/BINPUT, else the LONG_
    # form's u32: inline, as a call per index costs as much as the rest of the record).
    if tag_get is not None:
        tag = memo[tag_get[1] if tag_get[0] == 0x68 else unpack(tag_get, 1)[0]]
    else:
        tag = tag_text.decode("ascii")
        if tag_put is not None:
            memo[tag_put[1] if tag_put[0] == 0x71 else unpack(tag_put, 1)[0]] = tag
    if cls_get is not None:
        cls = memo[cls_get[1] if cls_get[0] == 0x68 else unpack(cls_get, 1)[0]]
    else:
        cls = u.find_global(cls_module.decode("ascii"), cls_name.decode("ascii"))
        if cls_put is not None:
            memo[cls_put[1] if cls_put[0] == 0x71 else unpack(cls_put, 1)[0]] = cls
    if key_get is not None:
        key = memo[key_get[1] if key_get[0] == 0x68 else unpack(key_get, 1)[0]]
    else:
        key = key_text.decode("ascii")
        if key_put is not None:
            memo[key_put[1] if key_put[0] == 0x71 else unpack(key_put, 1)[0]] = key
    if location_get is not None:
        location = memo[location_get[1] if location_get[0] == 0x68 else unpack(location_get, 1)[0]]
    else:
        location = location_text.decode("ascii")
        if location_put is not None:
            memo[location_put[1] if location_put[0] == 0x71 else unpack(location_put, 1)[0]] = location
    pid = (tag, cls, key, location, _int(numel_op), None) if view else (tag, cls, key, location, _int(numel_op))
    memo[pid_put[1] if pid_put[0] == 0x71 else unpack(pid_put, 1)[0]] = pid
    size = tuple(size_items)  # a tuple of its own, as the opcodes make: the tree tells shared tuples apart
    if size_put is not None:
        memo[size_put[1] if size_put[0] == 0x71 else unpack(size_put, 1)[0]] = size
    stride = tuple(stride_items)
    if stride_put is not None:
        memo[stride_put[1] if stride_put[0] == 0x71 else unpack(stride_put, 1)[0]] = stride
    if od_get is not None:
        ordered_dict = memo[od_get[1] if od_get[0] == 0x68 else unpack(od_get, 1)[0]]
    else:
        ordered_dict = u.find_global(od_module.decode("ascii"), od_name.decode("ascii"))
        if od_put is not None:
            memo[od_put[1] if od_put[0] == 0x71 else unpack(od_put, 1)[0]] = ordered_dict
    # The calls.
    storage = u.persistent_load(pid)
    offset = _int(offset_op)
    metadata = u.call(ordered_dict, ())
    memo[metadata_put[1] if metadata_put[0] == 0x71 else unpack(metadata_put, 1)[0]] = metadata
    args = (storage, offset, size, stride, grad == b"\x88", metadata)
    memo[args_put[1] if args_put[0] == 0x71 else unpack(args_put, 1)[0]] = args
    result = u.call(stack.pop(), args)
    memo[result_put[1] if result_put[0] == 0x71 else unpack(result_put, 1)[0]] = result
    stack.append(result)
    u.pos = match.end()
    return True


def _plain_tuples(memo: dict[int, Any], groups: tuple[Any, ...]) -> tuple[list[int], list[int]] | None:
    """The size's and stride's items, or None when the opcodes must run instead.

    Everything that could make the opcodes run instead is checked before the memo is touched: the strings'
    declared lengths, the tuples' counts, and that every get finds its key. A get of a key a PUT of this
    same record would write first (torch never writes one) is left to the opcodes too. Nothing after
    these checks can fail, so the memo needs no undoing.
    """
    (tag_get, tag_length, tag_text, _tag_put, cls_get, _cls_module, _cls_name, _cls_put,
     key_get, key_length, key_text, _key_put, location_get, location_length, location_text, _location_put,
     _numel_op, _view, _pid_put, _offset_op, size_op, _size_put, stride_op, _stride_put, _grad,
     od_get) = groups[:26]
    if ((tag_get is None and tag_length[0] != len(tag_text))
            or (key_get is None and key_length[0] != len(key_text))
            or (location_get is None and location_length[0] != len(location_text))):
        return None
    size_items = _TUPLES.get(size_op)
    stride_items = _TUPLES.get(stride_op)
    try:
        if size_items is None:
            size_items = _tuple_items(size_op)
        if stride_items is None:
            stride_items = _tuple_items(stride_op)
    except _Fallback:
        return None
    unpack = _U32.unpack_from
    for get in (tag_get, cls_get, key_get, location_get, od_get):
        if get is not None and (get[1] if get[0] == 0x68 else unpack(get, 1)[0]) not in memo:
            return None
    return size_items, stride_items


def _int(raw: bytes) -> int:
    op = raw[0]
    if op == 0x4B:
        return raw[1]
    if op == 0x4D:
        return raw[1] | raw[2] << 8
    return _I32.unpack_from(raw, 1)[0]


def _tuple_items(raw: bytes) -> list[int]:
    """The items of a size or stride tuple's opcodes, kept in ``_TUPLES`` while it has room."""
    items = list(_parse_tuple(raw))
    if len(_TUPLES) < MAX_TUPLES:
        _TUPLES[raw] = items
    return items


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
