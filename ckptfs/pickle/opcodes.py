"""What each pickle opcode does to the interpreter's state, as a table from opcode to step.

``unpickler.SafeUnpickler.load`` runs the commonest opcodes inline and every
other one through ``OPCODES``. Protocols 0–5 are read; extension codes and
out-of-band buffers are refused.
"""

from __future__ import annotations

from typing import Any, Callable

from ckptfs.errors import LimitExceededError, TruncatedPickleError, UnpicklingError
from ckptfs.pickle.machine import Machine
from ckptfs.pickle.scalars import SCALAR_OPCODES, parse_int
from ckptfs.pickle.values import Buildable, FastPathRefused, Global, PickledObject, Row, hashable_key


def set_items(target: Any, pairs: list[tuple[Any, Any]]) -> None:
    if isinstance(target, dict):
        for k, v in pairs:
            target[hashable_key(k)] = v
    elif isinstance(target, PickledObject):
        target.appended_dict().extend((hashable_key(k), v) for k, v in pairs)
    else:
        raise UnpicklingError(f"SETITEM on a {type(target).__name__}, which is not a mapping")


def append_items(target: Any, items: list[Any]) -> None:
    if isinstance(target, list):
        target.extend(items)
    elif isinstance(target, PickledObject):
        target.appended_list().extend(items)
    else:
        raise UnpicklingError(f"APPEND on a {type(target).__name__}, which is not a list")


def stop(u: Machine) -> None:
    raise AssertionError("handled in load()")


def _proto(u: Machine) -> None:
    u.proto = u.u8()
    if u.proto > 5:
        raise UnpicklingError(f"unsupported pickle protocol {u.proto}")


def _frame(u: Machine) -> None:
    size = u.u64()
    if size > len(u.data) - u.pos:
        raise TruncatedPickleError(
            f"pickle truncated: FRAME of {size} bytes exceeds the {len(u.data) - u.pos} bytes left"
        )


def _mark(u: Machine) -> None:
    if len(u.metastack) >= u.limits.max_stack_depth:
        raise LimitExceededError(f"pickle nests more than {u.limits.max_stack_depth} MARKs (limit max_stack_depth)")
    u.metastack.append(u.stack)
    u.stack = []


def _pop(u: Machine) -> None:
    if u.stack:
        u.stack.pop()
    else:
        u.pop_mark()


def _pop_mark(u: Machine) -> None:
    u.pop_mark()


def _dup(u: Machine) -> None:
    top = u.top()
    if isinstance(top, Row):
        raise FastPathRefused
    u.push(top)


def _push_const(value: Any) -> Callable[[Machine], None]:
    return lambda u: u.push(value)


def _refused(name: str) -> Callable[[Machine], None]:
    def handler(u: Machine) -> None:
        raise UnpicklingError(f"opcode {name} at offset {u.pos - 1} is refused")

    return handler


def _empty_tuple(u: Machine) -> None:
    u.push(())


def _tuple(u: Machine) -> None:
    u.push(tuple(u.pop_mark()))


def _tuple_n(n: int) -> Callable[[Machine], None]:
    def handler(u: Machine) -> None:
        if len(u.stack) < n:
            raise UnpicklingError(f"stack underflow at offset {u.pos - 1}")
        items = tuple(u.stack[-n:])
        del u.stack[-n:]
        u.push(items)

    return handler


def _empty_list(u: Machine) -> None:
    u.push([])


def _list(u: Machine) -> None:
    u.push(list(u.pop_mark()))


def _empty_dict(u: Machine) -> None:
    u.push({})


def _dict(u: Machine) -> None:
    items = u.pop_mark()
    if len(items) % 2:
        raise UnpicklingError("DICT with an odd number of items")
    result: dict[Any, Any] = {}
    set_items(result, list(zip(items[0::2], items[1::2])))
    u.push(result)


def _empty_set(u: Machine) -> None:
    u.push(set())


def _frozenset(u: Machine) -> None:
    u.push(frozenset(hashable_key(v) for v in u.pop_mark()))


def _additems(u: Machine) -> None:
    items = u.pop_mark()
    target = u.top()
    if isinstance(target, set):
        target.update(hashable_key(v) for v in items)
    elif isinstance(target, PickledObject):
        target.appended_list().extend(items)
    else:
        raise UnpicklingError(f"ADDITEMS on a {type(target).__name__}, which is not a set")


def _append(u: Machine) -> None:
    value = u.pop()
    append_items(u.top(), [value])


def _appends(u: Machine) -> None:
    items = u.pop_mark()
    append_items(u.top(), items)


def _setitem(u: Machine) -> None:
    value = u.pop()
    key = u.pop()
    set_items(u.top(), [(key, value)])


def _setitems(u: Machine) -> None:
    items = u.pop_mark()
    if len(items) % 2:
        raise UnpicklingError("SETITEMS with an odd number of items")
    set_items(u.top(), list(zip(items[0::2], items[1::2])))


def _get(u: Machine) -> None:
    u.push(u.memo_get(parse_int(u.read_line(), u)))


def _binget(u: Machine) -> None:
    u.push(u.memo_get(u.u8()))


def _long_binget(u: Machine) -> None:
    u.push(u.memo_get(u.u32()))


def _put(u: Machine) -> None:
    u.memo_put(parse_int(u.read_line(), u), u.top())


def _binput(u: Machine) -> None:
    u.memo_put(u.u8(), u.top())


def _long_binput(u: Machine) -> None:
    u.memo_put(u.u32(), u.top())


def _memoize(u: Machine) -> None:
    u.memo_put(len(u.memo), u.top())


def _text_global(u: Machine) -> Global:
    module = u.read_line().decode("utf-8", "replace")
    name = u.read_line().decode("utf-8", "replace")
    return u.find_global(module, name)


def _global_op(u: Machine) -> None:
    u.push(_text_global(u))


def _stack_global(u: Machine) -> None:
    name = u.pop()
    module = u.pop()
    if not isinstance(module, str) or not isinstance(name, str):
        raise UnpicklingError("STACK_GLOBAL needs two strings")
    u.push(u.find_global(module, name))


def _reduce(u: Machine) -> None:
    args = u.pop()
    func = u.pop()
    u.push(u.call(func, args))


def _newobj(u: Machine) -> None:
    args = u.pop()
    cls = u.pop()
    u.push(u.call(cls, args))


def _newobj_ex(u: Machine) -> None:
    kwargs = u.pop()
    args = u.pop()
    cls = u.pop()
    u.push(u.call(cls, args, None if isinstance(kwargs, dict) and not kwargs else kwargs))


def _inst(u: Machine) -> None:
    cls = _text_global(u)
    u.push(u.call(cls, tuple(u.pop_mark())))


def _obj(u: Machine) -> None:
    items = u.pop_mark()
    if not items:
        raise UnpicklingError("OBJ without a class")
    u.push(u.call(items[0], tuple(items[1:])))


def _build(u: Machine) -> None:
    state = u.pop()
    target = u.top()
    if isinstance(target, PickledObject):
        if target.state is None:
            target.state = state
        elif target.later_states is None:
            target.later_states = [state]
        else:
            target.later_states.append(state)
    elif isinstance(target, Buildable):
        target.apply_state(state)
    elif isinstance(target, Row):  # its object would keep the state, a row cannot
        raise FastPathRefused
    # BUILD on a plain container (an OrderedDict's ``_metadata``) sets Python
    # attributes the data model does not carry; the state is dropped.


def _persid(u: Machine) -> None:
    pid = u.read_line().decode("ascii", "replace")
    u.push(u.persistent_load(pid))


def _binpersid(u: Machine) -> None:
    u.push(u.persistent_load(u.pop()))


OPCODES: dict[int, Callable[[Machine], None]] = {
    **SCALAR_OPCODES,
    0x80: _proto,
    0x95: _frame,
    ord("."): stop,
    ord("("): _mark,
    ord("0"): _pop,
    ord("1"): _pop_mark,
    ord("2"): _dup,
    ord("N"): _push_const(None),
    0x88: _push_const(True),
    0x89: _push_const(False),
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
