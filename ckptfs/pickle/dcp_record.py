"""One step for each per-item pattern of a torch.distributed.checkpoint ``.metadata`` pickle (protocol 4).

``pickle.dump(metadata)`` writes, for every tensor of ``state_dict_metadata``, ~60 opcodes
(``TensorStorageMetadata`` with its ``TensorProperties``, ``torch.Size`` and one ``ChunkStorageMetadata``
per chunk), and for every ``storage_data`` entry ~40 (a ``MetadataIndex`` key and a ``_StorageInfo``
value). After the first item, every class, dtype and attribute name is a memo get. ``SafeUnpickler``
(``load_dcp``) matches such an item with regular expressions and pushes one row instead of the inert objects:
the key (the name, or a ``StorageKey``) and a ``TensorRow`` / ``StorageRow`` holding what
``formats.dcp_metadata`` reads, nothing else. The item's memo writes happen in their order (so every later
index is the same), the strings and dtypes with their values, every other object as ``UNBUILT``: a later get
of one (torch never writes one) stops the parse and the caller parses again on the reference path.

A row is only a stand-in for its object: ``unpickler.load_dcp`` parses again on the reference path when one
is copied or built on (``FastPathRefused``), when an error comes after one was made, or when one ends anywhere
but its item's place (``in_place``).

Anything else falls to the opcodes: a get of a key this item writes or of an ``UNBUILT`` one, a get whose
value is not the expected class or attribute name, a string whose declared length disagrees, a negative or
LONG-coded size, a memo made sparse by ``BINPUT``, the stack or memo near its limit.
"""

from __future__ import annotations

import re
import struct
from typing import Any, Callable

from ckptfs.pickle.values import UNBUILT, Global, PickledObject, Row

_MOD = "torch.distributed.checkpoint.metadata"
TENSOR_ITEM = Global(_MOD, "TensorStorageMetadata")
PROPERTIES = Global(_MOD, "TensorProperties")
CHUNK = Global(_MOD, "ChunkStorageMetadata")
INDEX = Global(_MOD, "MetadataIndex")
STORAGE_INFO = Global("torch.distributed.checkpoint.filesystem", "_StorageInfo")
SIZE = Global("torch", "Size")
_TENSOR_OPENERS = (0x8C,)  # SHORT_BINUNICODE: a tensor item opens with its name
_STORAGE_OPENERS = (0x68, 0x6A)  # BINGET, LONG_BINGET: a storage entry opens with MetadataIndex

_G = rb"(h.|j....)"
_NEW = rb"\)\x81\x94}\x94\("  # EMPTY_TUPLE NEWOBJ MEMOIZE EMPTY_DICT MEMOIZE MARK
_INTS = rb"(\)|(?:K.|M..|J....){1,3}[\x85-\x87]\x94|\((?:K.|M..|J....){0,64}t\x94)"
_SIZE = _G + _INTS + rb"\x85\x94R\x94"  # torch.Size((ints,))
_STR = rb"(?:" + _G + rb"|\x8c(.)(.{0,255}?)\x94)"
_INT = rb"(K.|M..|J....|N)"
_BIG = rb"(K.|M..|J....|\x8a[\x01-\x08].{1,8}?)"

HEAD = re.compile(
    _G + _NEW + _G + _G + rb"\)\x81\x94\("
    + rb"(?:" + _G + rb"|" + _G + rb"\x8c(.)([A-Za-z0-9_]{1,64})\x94\x93\x94)"
    + _G + rb"([\x88\x89])" + _G + rb"[\x88\x89]t\x94b" + _G + _SIZE + _G + rb"\]\x94(\(?)", re.DOTALL)
"""A tensor item after its name, up to its chunk list: class, properties (dtype get, or module get and name), size."""
CHUNK_ITEM = re.compile(_G + _NEW + _G + _SIZE + _G + _SIZE + rb"ub", re.DOTALL)
STORAGE_ITEM = re.compile(
    _G + _NEW + _G + _STR + _G + _INT + _G + _SIZE + rb"ub"
    + _G + _NEW + _G + _STR + _G + _BIG + _G + _BIG + rb"ub", re.DOTALL)
MAX_PUSHES = 16
MAX_CHUNKS = 1000
"""Chunks of one item in one ``APPENDS`` (pickle's batch); more fall to the opcodes."""
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_TUPLES: dict[bytes, tuple[int, ...] | None] = {}
MAX_TUPLES = 4096


class TensorRow(Row):
    """What a ``TensorStorageMetadata`` item says: dtype (a ``Global``), ``requires_grad``, size, chunk boxes."""

    __slots__ = ("dtype", "requires_grad", "size", "chunks")
    class_name = TENSOR_ITEM.qualname

    def __init__(self, dtype: Global, requires_grad: bool, size: tuple[int, ...],
                 chunks: list[tuple[tuple[int, ...], tuple[int, ...]]]) -> None:
        self.dtype, self.requires_grad, self.size, self.chunks = dtype, requires_grad, size, chunks


class StorageKey(Row):
    """A ``MetadataIndex`` key (kept by identity, as its inert object would be): FQN and chunk offsets."""

    __slots__ = ("fqn", "offset")
    class_name = INDEX.qualname

    def __init__(self, fqn: Any, offset: tuple[int, ...]) -> None:
        self.fqn, self.offset = fqn, offset


class StorageRow(Row):
    """A ``_StorageInfo`` without transforms: file name and byte range, as pickled (checked by the caller)."""

    __slots__ = ("relative_path", "offset", "length")
    class_name = STORAGE_INFO.qualname

    def __init__(self, relative_path: Any, offset: int | None, length: int | None) -> None:
        self.relative_path, self.offset, self.length = relative_path, offset, length


class _Fallback(Exception):
    pass


def _room(u: Any) -> tuple[int, int]:
    """The memo writes and stack pushes the items may make from here: none when the memo was rewritten or the
    MARKs near their limit (the opcodes then run, so that limit errors come in their order). An item needs
    ``len(stack) + 2 < max_stack_depth`` as it starts."""
    limits = u.limits
    if u.memo_rewritten or limits.max_stack_depth < MAX_PUSHES or len(u.metastack) + 4 > limits.max_stack_depth:
        return 0, 0
    return limits.max_memo_entries - len(u.memo), limits.max_stack_depth - 2 - len(u.stack)


def _get(memo: dict[int, Any], below: int, raw: bytes) -> Any:
    index = raw[1] if raw[0] == 0x68 else _U32.unpack_from(raw, 1)[0]
    if index >= below:  # a slot this item writes, or a missing one: the opcodes say what happens
        raise _Fallback
    value = memo[index]
    if value is UNBUILT:
        raise _Fallback
    return value


def _expect(memo: dict[int, Any], below: int, raw: bytes, want: Any) -> None:
    value = _get(memo, below, raw)
    if type(value) is not type(want) or value != want:
        raise _Fallback


def _text(length: bytes, raw: bytes) -> str:
    if length[0] != len(raw):
        raise _Fallback
    try:
        return raw.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        raise _Fallback from None


def _ints(raw: bytes) -> tuple[tuple[int, ...], int]:
    """A tuple's items and its memo writes (none for EMPTY_TUPLE)."""
    items = _TUPLES.get(raw)
    if items is None:
        items = _parse_ints(raw)
        if len(_TUPLES) < MAX_TUPLES:
            _TUPLES[raw] = items
    return items, 0 if raw == b")" else 1


def _parse_ints(raw: bytes) -> tuple[int, ...]:
    if raw == b")":
        return ()
    body, count = (raw[1:-2], -1) if raw[0] == 0x28 else (raw[:-2], raw[-2] - 0x84)
    values = []
    pos = 0
    while pos < len(body):
        op = body[pos]
        if op == 0x4B:
            values.append(body[pos + 1])
            pos += 2
        elif op == 0x4D:
            values.append(body[pos + 1] | body[pos + 2] << 8)
            pos += 3
        else:
            values.append(_I32.unpack_from(body, pos + 1)[0])
            pos += 5
    if (count >= 0 and len(values) != count) or (values and min(values) < 0):
        raise _Fallback
    return tuple(values)


def _int(raw: bytes) -> int | None:
    op = raw[0]
    if op == 0x4B:
        return raw[1]
    if op == 0x4D:
        return raw[1] | raw[2] << 8
    if op == 0x4A:
        return _I32.unpack_from(raw, 1)[0]
    if op == 0x4E:
        return None
    if raw[1] != len(raw) - 2:
        raise _Fallback
    return int.from_bytes(raw[2:], "little", signed=True)


_ANY = object()
"""An expected get whose value is not read (a layout, a memory format): any value made."""
_HEAD_WANTS = (TENSOR_ITEM, "properties", PROPERTIES, _ANY, _ANY, "size", SIZE, "chunks")
_CHUNK_WANTS = (CHUNK, "offsets", SIZE, "sizes", SIZE)
_STORAGE_WANTS = (INDEX, "fqn", "index", "offset", SIZE, STORAGE_INFO, "relative_path", "offset", "length")


def _check(u: Any, below: int, gets: tuple[bytes, ...], wants: tuple[Any, ...]) -> None:
    """That each get finds its expected value; remembered (callers look first), as the memo only grows while the
    items are matched (``memo_rewritten``)."""
    memo = u.memo
    for raw, want in zip(gets, wants):
        value = _get(memo, below, raw)
        if want is not _ANY and (type(value) is not type(want) or value != want):
            raise _Fallback
    u.dcp_checked.add(gets)


def _value(u: Any, below: int, raw: bytes) -> Any:
    """A get's value, remembered (a dtype or file name is got once per item)."""
    value = u.dcp_values.get(raw)
    if value is None:
        value = _get(u.memo, below, raw)
        u.dcp_values[raw] = value
    return value


def apply_tensor(u: Any, data: bytes, pos: int) -> bool:
    """The tensor items from ``pos`` on; False (nothing done) when the opcodes should run at ``pos``."""
    return _items(u, data, pos, _TENSOR_OPENERS, _tensor)


def _items(u: Any, data: bytes, pos: int, openers: tuple[int, ...],
           item: Callable[[Any, bytes, int, int], tuple[int, int]]) -> bool:
    """Items matched one after another while the next byte can open one (``openers``) and the memo and stack
    have room; False when none was."""
    start = pos
    memo_room, push_room = _room(u)
    while push_room > 0 and pos < len(data) and data[pos] in openers:
        try:
            pos, puts = item(u, data, pos, memo_room)
        except _Fallback:
            break
        memo_room -= puts
        push_room -= 2
    return pos != start


def _tensor(u: Any, data: bytes, pos: int, memo_room: int) -> tuple[int, int]:
    name_end = pos + 2 + data[pos + 1] if pos + 1 < len(data) else len(data)
    head = HEAD.match(data, name_end + 1) if data[name_end : name_end + 1] == b"\x94" else None
    if head is None:
        raise _Fallback
    chunk_match = CHUNK_ITEM.match
    (cls, props_key, props_cls, dtype_get, module_get, dtype_length, dtype_name, layout, grad,
     memory_format, size_key, size_cls, size_ops, chunks_key, many) = head.groups()
    boxes: list[tuple[bytes, ...]] = []
    at = head.end()
    while len(boxes) < MAX_CHUNKS:
        chunk = chunk_match(data, at)
        if chunk is None:
            break
        boxes.append(chunk.groups())
        at = chunk.end()
        if not many:
            break
    if not boxes or not data.startswith(b"eub" if many else b"aub", at):
        raise _Fallback
    memo = u.memo
    below = len(memo)
    checked = u.dcp_checked
    size, size_puts = _ints(size_ops)
    chunks = []
    puts = 8 + size_puts + (2 if dtype_get is None else 0) + 6 * len(boxes)
    for cls_get, offsets_key, offsets_cls, offsets_ops, sizes_key, sizes_cls, sizes_ops in boxes:
        gets = (cls_get, offsets_key, offsets_cls, sizes_key, sizes_cls)
        if gets not in checked:
            _check(u, below, gets, _CHUNK_WANTS)
        offsets, offsets_puts = _ints(offsets_ops)
        sizes, sizes_puts = _ints(sizes_ops)
        chunks.append((offsets, sizes))
        puts += offsets_puts + sizes_puts
    if puts > memo_room:
        raise _Fallback
    try:
        name_text = data[pos + 2 : name_end].decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        raise _Fallback from None
    head_gets = (cls, props_key, props_cls, layout, memory_format, size_key, size_cls, chunks_key)
    if head_gets not in checked:
        _check(u, below, head_gets, _HEAD_WANTS)
    if dtype_get is not None:
        dtype = _value(u, below, dtype_get)
        if type(dtype) is not Global:
            raise _Fallback
        dtype_strings: tuple[Any, ...] = ()
    else:
        module = _get(memo, below, module_get)
        if type(module) is not str:
            raise _Fallback
        dtype_text = _text(dtype_length, dtype_name)
        dtype = u.find_global(module, dtype_text)
        dtype_strings = (dtype_text, dtype)
    # The memo writes in opcode order: the name, the item, its dict, the properties, a new dtype's name and
    # global, the properties' tuple, the size's ints, arguments and Size, the chunk list, then each chunk's.
    memo.update(dict.fromkeys(range(below, below + puts), UNBUILT))
    memo[below] = name_text
    if dtype_strings:
        memo[below + 4], memo[below + 5] = dtype_strings
    u.stack += (name_text, TensorRow(dtype, grad == b"\x88", size, chunks))
    u.dcp_tensor_rows += 1
    u.pos = at + 3
    return u.pos, puts


def apply_storage(u: Any, data: bytes, pos: int) -> bool:
    """The ``storage_data`` entries from ``pos`` on (each a get of ``MetadataIndex`` first)."""
    return _items(u, data, pos, _STORAGE_OPENERS, _storage)


def _storage(u: Any, data: bytes, pos: int, memo_room: int) -> tuple[int, int]:
    match = STORAGE_ITEM.match(data, pos)
    if match is None:
        raise _Fallback
    (index_cls, fqn_key, fqn_get, fqn_length, fqn_raw, index_key, index_op, offset_key, offset_cls, offset_ops,
     info_cls, path_key, path_get, path_length, path_raw, start_key, start_op, length_key, length_op) = match.groups()
    memo = u.memo
    below = len(memo)
    offset, offset_puts = _ints(offset_ops)
    puts = 6 + offset_puts + (fqn_get is None) + (path_get is None)
    if puts > memo_room:
        raise _Fallback
    gets = (index_cls, fqn_key, index_key, offset_key, offset_cls, info_cls, path_key, start_key, length_key)
    if gets not in u.dcp_checked:
        _check(u, below, gets, _STORAGE_WANTS)
    fqn = _get(memo, below, fqn_get) if fqn_get is not None else _text(fqn_length, fqn_raw)
    _int(index_op)
    path = _value(u, below, path_get) if path_get is not None else _text(path_length, path_raw)
    start, length = _int(start_op), _int(length_op)
    # The memo writes in opcode order: the key, its dict, a new FQN, the offset's ints, arguments and Size,
    # the value, its dict, a new file name.
    memo.update(dict.fromkeys(range(below, below + puts), UNBUILT))
    if fqn_get is None:
        memo[below + 2] = fqn
    if path_get is None:
        memo[below + puts - 1] = path
    u.stack += (StorageKey(fqn, offset), StorageRow(path, start, length))
    u.dcp_storage_rows += 1
    u.pos = match.end()
    return u.pos, puts


def in_place(u: Any, root: Any) -> bool:
    """Whether every row made ended where torch's items are: each ``TensorRow`` a value of the root's
    ``state_dict_metadata`` dict, each ``StorageKey`` / ``StorageRow`` a key / value of its ``storage_data``.

    Found there, a row went nowhere else: none is copied (a ``DUP`` or memo put of one refuses the fast parse),
    so no opcode took one as a callable, argument or key, where its type would show through. The opcodes that
    use the top of the stack and leave it there fail on a row (``APPEND``, ``SETITEM``, ``ADDITEMS``: an error
    after a row is made sends the parse to the reference path) or refuse (``BUILD``). So the reference path puts
    its objects in the same places, and nothing else has touched them."""
    if not u.dcp_tensor_rows and not u.dcp_storage_rows:
        return True
    state = root.state if type(root) is PickledObject else None
    if type(state) is tuple and len(state) == 2 and state[0] is None:
        state = state[1]
    if type(state) is not dict:
        return False
    items, storage = state.get("state_dict_metadata"), state.get("storage_data")
    tensors = sum(type(v) is TensorRow for v in items.values()) if type(items) is dict else 0
    keys = sum(type(k) is StorageKey for k in storage) if type(storage) is dict else 0
    values = sum(type(v) is StorageRow for v in storage.values()) if type(storage) is dict else 0
    return tensors == u.dcp_tensor_rows and keys == values == u.dcp_storage_rows
