"""A pickle interpreter that never imports or calls anything named in the stream.

``GLOBAL``/``STACK_GLOBAL``/``INST`` produce inert :class:`Global` names. A call
(``REDUCE``, ``NEWOBJ``, ``OBJ``, ``INST``) is handed to ``resolve``, which may
return a handler of ckptfs' own for a known name; every other call becomes an
inert :class:`PickledObject` holding the callable, its arguments and any state
or items later attached to it. Containers are mutated only when the interpreter
built them itself. Protocols 0–5 are read; extension codes and out-of-band
buffers are refused.
"""

from __future__ import annotations

import codecs
import itertools
import struct
from dataclasses import dataclass, field
from typing import Any, Callable

from ckptfs import tensor_record
from ckptfs.errors import LimitExceededError, TruncatedPickleError, UnpicklingError
from ckptfs.limits import Limits


@dataclass(frozen=True)
class Global:
    """A ``module.name`` reference from the stream; never imported."""

    module: str
    name: str

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.name}"


@dataclass(eq=False, repr=False)
class PickledObject:
    """An inert description of an object the pickle would have constructed."""

    callable: Any
    args: tuple[Any, ...] = ()
    kwargs: Any = None
    """``NEWOBJ_EX``'s keyword arguments (a dict, unless the pickle is hand-made); None when there are none."""
    state: Any = None
    later_states: list[Any] | None = None
    """States of further ``BUILD``s (a hand-made pickle's: the first may plant a ``__setstate__``)."""
    list_items: list[Any] = field(default_factory=list)
    dict_items: list[tuple[Any, Any]] = field(default_factory=list)

    @property
    def class_name(self) -> str:
        return self.callable.qualname if isinstance(self.callable, Global) else type(self.callable).__name__

    def __repr__(self) -> str:
        # The arguments only bounded (``short_repr``): they may be deep, cyclic or shared 2**40 times.
        return f"<{self.class_name}(...)>"


@dataclass(eq=False, repr=False)
class UnhashableKey:
    """A dict key kept by identity: Python cannot hash it (a list…), or hashing it is unbounded.

    Tuples do not cache their hash, so a tuple key that is deep or shares its
    parts (2**40 paths in 300 bytes) is wrapped rather than hashed.
    """

    value: Any

    def __repr__(self) -> str:
        return short_repr(self.value)


class Buildable:
    """Base of ckptfs' own values that accept a ``BUILD`` state."""

    def apply_state(self, state: Any) -> None:
        raise NotImplementedError


Handler = Callable[[tuple[Any, ...]], Any]
Resolver = Callable[[Global], Handler | None]

_RENAMED_MODULES = {"__builtin__": "builtins", "copy_reg": "copyreg", "exceptions": "builtins"}
MAX_LONG_BYTES = 1785
"""Largest LONG4 integer read: 1785 bytes stay under Python's 4300-digit int/str conversion limit."""


def _no_handler(_: Global) -> Handler | None:
    return None


def _refuse_persistent(pid: Any) -> Any:
    raise UnpicklingError(f"persistent id {short_repr(pid)} where none is expected")


_REPR_DEPTH = 3
_REPR_ITEMS = 4
_BRACKETS = {list: ("[", "]"), tuple: ("(", ")"), set: ("{", "}"), frozenset: ("frozenset({", "})"), dict: ("{", "}")}


def short_repr(value: Any, limit: int = 80) -> str:
    """A repr of a pickled value for messages: bounded in size and cost for deep, cyclic or shared values."""
    text = _bounded_repr(value, _REPR_DEPTH, limit)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _bounded_repr(value: Any, depth: int, limit: int) -> str:
    if isinstance(value, (str, bytes, bytearray)):
        return repr(value[: limit + 1])
    if value is None or isinstance(value, (bool, int, float, complex)):
        return repr(value)
    if isinstance(value, Global):
        return value.qualname[: limit + 1]
    if isinstance(value, UnhashableKey):
        return _bounded_repr(value.value, depth, limit)
    if isinstance(value, PickledObject):
        if not value.args:
            return f"<{value.class_name}()>"
        return f"<{value.class_name}{_bounded_repr(value.args, depth, limit)}>" if depth else repr(value)
    brackets = _BRACKETS.get(type(value))
    if brackets is None:
        return f"<{type(value).__name__}>"
    if depth == 0:
        return "..."
    if isinstance(value, dict):
        parts = [f"{_bounded_repr(k, depth - 1, limit)}: {_bounded_repr(v, depth - 1, limit)}"
                 for k, v in itertools.islice(value.items(), _REPR_ITEMS)]
    else:
        parts = [_bounded_repr(v, depth - 1, limit) for v in itertools.islice(value, _REPR_ITEMS)]
    if len(value) > _REPR_ITEMS:
        parts.append("...")
    trailer = "," if isinstance(value, tuple) and len(value) == 1 else ""
    return brackets[0] + ", ".join(parts) + trailer + brackets[1]


class SafeUnpickler:
    def __init__(
        self,
        data: bytes | memoryview,
        *,
        resolve: Resolver = _no_handler,
        persistent_load: Callable[[Any], Any] = _refuse_persistent,
        limits: Limits = Limits(),
    ) -> None:
        if len(data) > limits.max_pickle_bytes:
            raise LimitExceededError(
                f"pickle of {len(data)} bytes exceeds the limit of {limits.max_pickle_bytes} bytes"
            )
        self.data = bytes(data)
        self.pos = 0
        self.resolve = resolve
        self.persistent_load = persistent_load
        self.limits = limits
        self.memo: dict[int, Any] = {}
        self.stack: list[Any] = []
        self.metastack: list[list[Any]] = []
        self.proto = 0

    # -- reading primitives -------------------------------------------------

    def _take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise TruncatedPickleError(
                f"pickle truncated: needs {n} bytes at offset {self.pos}, "
                f"{len(self.data) - self.pos} remain"
            )
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def _line(self) -> bytes:
        end = self.data.find(b"\n", self.pos)
        if end < 0:
            raise TruncatedPickleError(f"pickle truncated: unterminated line at offset {self.pos}")
        line = self.data[self.pos : end]
        self.pos = end + 1
        return line

    def _u8(self) -> int:
        return self._take(1)[0]

    def _u16(self) -> int:
        return int.from_bytes(self._take(2), "little")

    def _u32(self) -> int:
        return int.from_bytes(self._take(4), "little")

    def _u64(self) -> int:
        return int.from_bytes(self._take(8), "little")

    # -- stack helpers -------------------------------------------------------

    def _push(self, value: Any) -> None:
        if len(self.stack) >= self.limits.max_stack_depth:
            raise LimitExceededError(f"pickle stack exceeds {self.limits.max_stack_depth} entries")
        self.stack.append(value)

    def _pop(self) -> Any:
        if not self.stack:
            raise UnpicklingError(f"stack underflow at offset {self.pos - 1}")
        return self.stack.pop()

    def _top(self) -> Any:
        if not self.stack:
            raise UnpicklingError(f"stack underflow at offset {self.pos - 1}")
        return self.stack[-1]

    def _pop_mark(self) -> list[Any]:
        if not self.metastack:
            raise UnpicklingError(f"no MARK on the stack at offset {self.pos - 1}")
        items = self.stack
        self.stack = self.metastack.pop()
        return items

    def _memo_put(self, index: int, value: Any) -> None:
        if index not in self.memo and len(self.memo) >= self.limits.max_memo_entries:
            raise LimitExceededError(f"pickle memo exceeds {self.limits.max_memo_entries} entries")
        self.memo[index] = value

    def _memo_get(self, index: int) -> Any:
        try:
            return self.memo[index]
        except KeyError:
            raise UnpicklingError(f"memo key {index} not found at offset {self.pos}") from None

    # -- semantic helpers ----------------------------------------------------

    def _global(self, module: str, name: str) -> Global:
        return Global(_RENAMED_MODULES.get(module, module), name)

    def _call(self, func: Any, args: Any, kwargs: Any = None) -> Any:
        if not isinstance(args, tuple):
            args = (args,) if not isinstance(args, list) else tuple(args)
        if isinstance(func, Global) and kwargs is None:
            handler = self.resolve(func)
            if handler is not None:
                try:
                    return handler(args)
                except (TypeError, ValueError, OverflowError) as exc:
                    raise UnpicklingError(f"bad arguments to {func.qualname}: {exc}") from None
        return PickledObject(func, args, kwargs)

    def _decode_str(self, raw: bytes) -> str | bytes:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw

    # -- main loop -------------------------------------------------------------

    def load(self) -> Any:
        # The opcodes of a torch state dict are handled inline (memo, strings, small ints,
        # tuples): a method call per opcode would double the cost of opening a checkpoint.
        dispatch = _DISPATCH
        data = self.data
        end = len(data)
        memo = self.memo
        max_memo = self.limits.max_memo_entries
        max_depth = self.limits.max_stack_depth
        unpack_u32 = _U32.unpack_from
        record_match = tensor_record.PATTERN.match
        while True:
            pos = self.pos
            if pos >= end:
                raise TruncatedPickleError("pickle truncated: no STOP opcode")
            op = data[pos]
            stack = self.stack
            if op in _INLINE:
                if op == 0x71 or op == 0x72 or op == 0x94:  # BINPUT, LONG_BINPUT, MEMOIZE
                    if op == 0x71:
                        if pos + 2 > end:
                            break
                        index = data[pos + 1]
                        self.pos = pos + 2
                    elif op == 0x72:
                        if pos + 5 > end:
                            break
                        index = unpack_u32(data, pos + 1)[0]
                        self.pos = pos + 5
                    else:
                        index = len(memo)
                        self.pos = pos + 1
                    if not stack:
                        raise UnpicklingError(f"stack underflow at offset {pos}")
                    if index not in memo and len(memo) >= max_memo:
                        raise LimitExceededError(f"pickle memo exceeds {max_memo} entries")
                    memo[index] = stack[-1]
                    continue
                if len(stack) >= max_depth:
                    raise LimitExceededError(f"pickle stack exceeds {max_depth} entries")
                if op == 0x68 or op == 0x6A:  # BINGET, LONG_BINGET
                    if op == 0x68:
                        if pos + 2 > end:
                            break
                        index = data[pos + 1]
                        self.pos = pos + 2
                    else:
                        if pos + 5 > end:
                            break
                        index = unpack_u32(data, pos + 1)[0]
                        self.pos = pos + 5
                    try:
                        stack.append(memo[index])
                    except KeyError:
                        raise UnpicklingError(f"memo key {index} not found at offset {self.pos}") from None
                    continue
                if op == 0x58 or op == 0x8C:  # BINUNICODE, SHORT_BINUNICODE
                    if op == 0x58:
                        if pos + 5 > end:
                            break
                        start = pos + 5
                        stop = start + unpack_u32(data, pos + 1)[0]
                    else:
                        if pos + 2 > end:
                            break
                        start = pos + 2
                        stop = start + data[pos + 1]
                    if stop > end:
                        break
                    self.pos = stop
                    stack.append(_unicode_text(data[start:stop], self, "utf-8"))
                    continue
                if op == 0x4B:  # BININT1
                    if pos + 2 > end:
                        break
                    stack.append(data[pos + 1])
                    self.pos = pos + 2
                    continue
                if op == 0x74:  # TUPLE
                    self.pos = pos + 1
                    items = self._pop_mark()
                    self.stack.append(tuple(items))
                    continue
                self.pos = pos + 1
                if op == 0x29:  # EMPTY_TUPLE
                    stack.append(())
                elif op == 0x89:  # NEWFALSE
                    stack.append(False)
                else:  # TUPLE1, TUPLE2, TUPLE3
                    n = op - 0x84
                    if len(stack) < n:
                        raise UnpicklingError(f"stack underflow at offset {pos}")
                    items = tuple(stack[-n:])
                    del stack[-n:]
                    stack.append(items)
                continue
            if op == 0x28:  # MARK: perhaps the start of a tensor record
                record = record_match(data, pos)
                if record is not None and tensor_record.apply(self, record):
                    continue
            self.pos = pos + 1
            handler = dispatch.get(op)
            if handler is None:
                raise UnpicklingError(f"unknown or refused opcode 0x{op:02x} at offset {pos}")
            if handler is _stop:
                return self._pop()
            handler(self)
        # A fast-path opcode whose argument runs past the end: let its handler report it.
        self.pos += 1
        _DISPATCH[data[self.pos - 1]](self)
        raise AssertionError("unreachable")


_U32 = struct.Struct("<I")
_INLINE = frozenset({0x71, 0x72, 0x94, 0x68, 0x6A, 0x58, 0x8C, 0x4B, 0x74, 0x29, 0x89, 0x85, 0x86, 0x87})


HASH_BUDGET = 1000
"""Most tuple elements, counted along every path, that hashing one key may visit."""


def hashable_key(value: Any) -> Any:
    """``value`` when it can serve as a dict key or set element, else it wrapped in :class:`UnhashableKey`."""
    if isinstance(value, (str, int, float, bytes, Global)) or value is None:
        return value
    if not _hash_is_bounded(value):
        return UnhashableKey(value)
    try:
        hash(value)
    except TypeError:
        return UnhashableKey(value)
    return value


def _hash_is_bounded(value: Any) -> bool:
    pending = [value]
    budget = HASH_BUDGET
    while pending:
        item = pending.pop()
        if isinstance(item, tuple):
            budget -= len(item)
            if budget < 0:
                return False
            pending.extend(item)
    return True


def _set_items(target: Any, pairs: list[tuple[Any, Any]]) -> None:
    if isinstance(target, dict):
        for k, v in pairs:
            target[hashable_key(k)] = v
    elif isinstance(target, PickledObject):
        target.dict_items.extend((hashable_key(k), v) for k, v in pairs)
    else:
        raise UnpicklingError(f"SETITEM on a {type(target).__name__}, which is not a mapping")


def _append_items(target: Any, items: list[Any]) -> None:
    if isinstance(target, list):
        target.extend(items)
    elif isinstance(target, PickledObject):
        target.list_items.extend(items)
    else:
        raise UnpicklingError(f"APPEND on a {type(target).__name__}, which is not a list")


def _stop(u: SafeUnpickler) -> None:
    raise AssertionError("handled in load()")


def _proto(u: SafeUnpickler) -> None:
    u.proto = u._u8()
    if u.proto > 5:
        raise UnpicklingError(f"unsupported pickle protocol {u.proto}")


def _frame(u: SafeUnpickler) -> None:
    size = u._u64()
    if size > len(u.data) - u.pos:
        raise TruncatedPickleError(
            f"pickle truncated: FRAME of {size} bytes exceeds the {len(u.data) - u.pos} bytes left"
        )


def _mark(u: SafeUnpickler) -> None:
    if len(u.metastack) >= u.limits.max_stack_depth:
        raise LimitExceededError(f"pickle nests more than {u.limits.max_stack_depth} MARKs (limit max_stack_depth)")
    u.metastack.append(u.stack)
    u.stack = []


def _pop(u: SafeUnpickler) -> None:
    if u.stack:
        u.stack.pop()
    else:
        u._pop_mark()


def _pop_mark(u: SafeUnpickler) -> None:
    u._pop_mark()


def _dup(u: SafeUnpickler) -> None:
    u._push(u._top())


def _push_const(value: Any) -> Callable[[SafeUnpickler], None]:
    return lambda u: u._push(value)


def _int(u: SafeUnpickler) -> None:
    line = u._line()
    if line == b"00":
        u._push(False)
    elif line == b"01":
        u._push(True)
    else:
        u._push(_parse_int(line, u))


def _parse_int(text: bytes, u: SafeUnpickler) -> int:
    try:
        return int(text.rstrip(b"L"))
    except ValueError as exc:
        raise UnpicklingError(f"bad integer literal at offset {u.pos}: {exc}") from None


def _long(u: SafeUnpickler) -> None:
    u._push(_parse_int(u._line(), u))


def _binint(u: SafeUnpickler) -> None:
    u._push(struct.unpack("<i", u._take(4))[0])


def _binint1(u: SafeUnpickler) -> None:
    u._push(u._u8())


def _binint2(u: SafeUnpickler) -> None:
    u._push(u._u16())


def _long1(u: SafeUnpickler) -> None:
    u._push(int.from_bytes(u._take(u._u8()), "little", signed=True))


def _long4(u: SafeUnpickler) -> None:
    n = struct.unpack("<i", u._take(4))[0]
    if n < 0:
        raise UnpicklingError("LONG4 with a negative byte count")
    if n > MAX_LONG_BYTES:
        raise UnpicklingError(f"LONG4 integer of {n} bytes (limit {MAX_LONG_BYTES}: Python's 4300-digit int limit)")
    u._push(int.from_bytes(u._take(n), "little", signed=True))


def _float(u: SafeUnpickler) -> None:
    try:
        u._push(float(u._line()))
    except ValueError:
        raise UnpicklingError(f"bad float literal at offset {u.pos}") from None


def _binfloat(u: SafeUnpickler) -> None:
    u._push(struct.unpack(">d", u._take(8))[0])


def _string(u: SafeUnpickler) -> None:
    raw = u._line()
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[:1] in (b"'", b'"'):
        raw = raw[1:-1]
    else:
        raise UnpicklingError(f"STRING opcode argument must be quoted at offset {u.pos}")
    try:
        decoded = codecs.escape_decode(raw)[0]
    except ValueError:
        raise UnpicklingError(f"bad STRING escape at offset {u.pos}") from None
    u._push(u._decode_str(decoded))


def _binstring(u: SafeUnpickler) -> None:
    n = struct.unpack("<i", u._take(4))[0]
    if n < 0:
        raise UnpicklingError("BINSTRING with a negative length")
    u._push(u._decode_str(u._take(n)))


def _short_binstring(u: SafeUnpickler) -> None:
    u._push(u._decode_str(u._take(u._u8())))


def _unicode_text(raw: bytes, u: SafeUnpickler, codec: str) -> str:
    try:
        return raw.decode(codec, "surrogatepass")
    except UnicodeDecodeError:
        raise UnpicklingError(f"invalid string encoding near offset {u.pos}") from None


def _unicode(u: SafeUnpickler) -> None:
    u._push(_unicode_text(u._line(), u, "raw-unicode-escape"))


def _binunicode(u: SafeUnpickler) -> None:
    u._push(_unicode_text(u._take(u._u32()), u, "utf-8"))


def _short_binunicode(u: SafeUnpickler) -> None:
    u._push(_unicode_text(u._take(u._u8()), u, "utf-8"))


def _binunicode8(u: SafeUnpickler) -> None:
    u._push(_unicode_text(u._take(u._u64()), u, "utf-8"))


def _binbytes(u: SafeUnpickler) -> None:
    u._push(u._take(u._u32()))


def _short_binbytes(u: SafeUnpickler) -> None:
    u._push(u._take(u._u8()))


def _binbytes8(u: SafeUnpickler) -> None:
    u._push(u._take(u._u64()))


def _bytearray8(u: SafeUnpickler) -> None:
    u._push(bytearray(u._take(u._u64())))


def _refused(name: str) -> Callable[[SafeUnpickler], None]:
    def handler(u: SafeUnpickler) -> None:
        raise UnpicklingError(f"opcode {name} at offset {u.pos - 1} is refused")

    return handler


def _empty_tuple(u: SafeUnpickler) -> None:
    u._push(())


def _tuple(u: SafeUnpickler) -> None:
    u._push(tuple(u._pop_mark()))


def _tuple_n(n: int) -> Callable[[SafeUnpickler], None]:
    def handler(u: SafeUnpickler) -> None:
        if len(u.stack) < n:
            raise UnpicklingError(f"stack underflow at offset {u.pos - 1}")
        items = tuple(u.stack[-n:])
        del u.stack[-n:]
        u._push(items)

    return handler


def _empty_list(u: SafeUnpickler) -> None:
    u._push([])


def _list(u: SafeUnpickler) -> None:
    u._push(list(u._pop_mark()))


def _empty_dict(u: SafeUnpickler) -> None:
    u._push({})


def _dict(u: SafeUnpickler) -> None:
    items = u._pop_mark()
    if len(items) % 2:
        raise UnpicklingError("DICT with an odd number of items")
    result: dict[Any, Any] = {}
    _set_items(result, list(zip(items[0::2], items[1::2])))
    u._push(result)


def _empty_set(u: SafeUnpickler) -> None:
    u._push(set())


def _frozenset(u: SafeUnpickler) -> None:
    u._push(frozenset(hashable_key(v) for v in u._pop_mark()))


def _additems(u: SafeUnpickler) -> None:
    items = u._pop_mark()
    target = u._top()
    if isinstance(target, set):
        target.update(hashable_key(v) for v in items)
    elif isinstance(target, PickledObject):
        target.list_items.extend(items)
    else:
        raise UnpicklingError(f"ADDITEMS on a {type(target).__name__}, which is not a set")


def _append(u: SafeUnpickler) -> None:
    value = u._pop()
    _append_items(u._top(), [value])


def _appends(u: SafeUnpickler) -> None:
    items = u._pop_mark()
    _append_items(u._top(), items)


def _setitem(u: SafeUnpickler) -> None:
    value = u._pop()
    key = u._pop()
    _set_items(u._top(), [(key, value)])


def _setitems(u: SafeUnpickler) -> None:
    items = u._pop_mark()
    if len(items) % 2:
        raise UnpicklingError("SETITEMS with an odd number of items")
    _set_items(u._top(), list(zip(items[0::2], items[1::2])))


def _get(u: SafeUnpickler) -> None:
    u._push(u._memo_get(_parse_int(u._line(), u)))


def _binget(u: SafeUnpickler) -> None:
    u._push(u._memo_get(u._u8()))


def _long_binget(u: SafeUnpickler) -> None:
    u._push(u._memo_get(u._u32()))


def _put(u: SafeUnpickler) -> None:
    u._memo_put(_parse_int(u._line(), u), u._top())


def _binput(u: SafeUnpickler) -> None:
    u._memo_put(u._u8(), u._top())


def _long_binput(u: SafeUnpickler) -> None:
    u._memo_put(u._u32(), u._top())


def _memoize(u: SafeUnpickler) -> None:
    u._memo_put(len(u.memo), u._top())


def _text_global(u: SafeUnpickler) -> Global:
    module = u._line().decode("utf-8", "replace")
    name = u._line().decode("utf-8", "replace")
    return u._global(module, name)


def _global_op(u: SafeUnpickler) -> None:
    u._push(_text_global(u))


def _stack_global(u: SafeUnpickler) -> None:
    name = u._pop()
    module = u._pop()
    if not isinstance(module, str) or not isinstance(name, str):
        raise UnpicklingError("STACK_GLOBAL needs two strings")
    u._push(u._global(module, name))


def _reduce(u: SafeUnpickler) -> None:
    args = u._pop()
    func = u._pop()
    u._push(u._call(func, args))


def _newobj(u: SafeUnpickler) -> None:
    args = u._pop()
    cls = u._pop()
    u._push(u._call(cls, args))


def _newobj_ex(u: SafeUnpickler) -> None:
    kwargs = u._pop()
    args = u._pop()
    cls = u._pop()
    u._push(u._call(cls, args, None if isinstance(kwargs, dict) and not kwargs else kwargs))


def _inst(u: SafeUnpickler) -> None:
    cls = _text_global(u)
    u._push(u._call(cls, tuple(u._pop_mark())))


def _obj(u: SafeUnpickler) -> None:
    items = u._pop_mark()
    if not items:
        raise UnpicklingError("OBJ without a class")
    u._push(u._call(items[0], tuple(items[1:])))


def _build(u: SafeUnpickler) -> None:
    state = u._pop()
    target = u._top()
    if isinstance(target, PickledObject):
        if target.state is None:
            target.state = state
        elif target.later_states is None:
            target.later_states = [state]
        else:
            target.later_states.append(state)
    elif isinstance(target, Buildable):
        target.apply_state(state)
    # BUILD on a plain container (an OrderedDict's ``_metadata``) sets Python
    # attributes the data model does not carry; the state is dropped.


def _persid(u: SafeUnpickler) -> None:
    pid = u._line().decode("ascii", "replace")
    u._push(u.persistent_load(pid))


def _binpersid(u: SafeUnpickler) -> None:
    u._push(u.persistent_load(u._pop()))


_DISPATCH: dict[int, Callable[[SafeUnpickler], None]] = {
    0x80: _proto,
    0x95: _frame,
    ord("."): _stop,
    ord("("): _mark,
    ord("0"): _pop,
    ord("1"): _pop_mark,
    ord("2"): _dup,
    ord("N"): _push_const(None),
    0x88: _push_const(True),
    0x89: _push_const(False),
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
    0x97: _refused("NEXT_BUFFER"),
    0x98: _refused("READONLY_BUFFER"),
    0x82: _refused("EXT1"),
    0x83: _refused("EXT2"),
    0x84: _refused("EXT4"),
    ord(")"): _empty_tuple,
    ord("t"): _tuple,
    0x85: _tuple_n(1),
    0x86: _tuple_n(2),
    0x87: _tuple_n(3),
    ord("]"): _empty_list,
    ord("l"): _list,
    ord("}"): _empty_dict,
    ord("d"): _dict,
    0x8F: _empty_set,
    0x91: _frozenset,
    0x90: _additems,
    ord("a"): _append,
    ord("e"): _appends,
    ord("s"): _setitem,
    ord("u"): _setitems,
    ord("g"): _get,
    ord("h"): _binget,
    ord("j"): _long_binget,
    ord("p"): _put,
    ord("q"): _binput,
    ord("r"): _long_binput,
    0x94: _memoize,
    ord("c"): _global_op,
    0x93: _stack_global,
    ord("R"): _reduce,
    0x81: _newobj,
    0x92: _newobj_ex,
    ord("i"): _inst,
    ord("o"): _obj,
    ord("b"): _build,
    ord("P"): _persid,
    ord("Q"): _binpersid,
}


def loads(
    data: bytes | memoryview,
    *,
    resolve: Resolver = _no_handler,
    persistent_load: Callable[[Any], Any] = _refuse_persistent,
    limits: Limits = Limits(),
    start: int = 0,
) -> tuple[Any, int]:
    """Interpret one pickle starting at ``start``; returns its inert value and end offset."""
    unpickler = SafeUnpickler(data, resolve=resolve, persistent_load=persistent_load, limits=limits)
    unpickler.pos = start
    return unpickler.load(), unpickler.pos
