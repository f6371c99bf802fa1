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

import struct
from typing import Any, Callable

from ckptfs.errors import LimitExceededError, TruncatedPickleError, UnpicklingError
from ckptfs.limits import Limits
from ckptfs.pickle import tensor_record
from ckptfs.pickle.machine import Machine, no_handler, refuse_persistent
from ckptfs.pickle.opcodes import OPCODES
from ckptfs.pickle.opcodes import stop as stop_step
from ckptfs.pickle.scalars import unicode_text
from ckptfs.pickle.values import Resolver


class SafeUnpickler(Machine):
    def load(self) -> Any:
        """Runs the opcodes from ``pos`` to STOP and returns the inert value.

        One long loop on purpose: the opcodes of a torch state dict (memo,
        strings, small ints, tuples) are handled inline, and the ~28 opcodes of
        each tensor record in one step (``tensor_record``); a call per opcode
        would double the cost of opening a checkpoint. Every other opcode goes
        through the ``OPCODES`` table.
        """
        dispatch = OPCODES
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
                    stack.append(unicode_text(data[start:stop], self, "utf-8"))
                    continue
                if op == 0x4B:  # BININT1
                    if pos + 2 > end:
                        break
                    stack.append(data[pos + 1])
                    self.pos = pos + 2
                    continue
                if op == 0x74:  # TUPLE
                    self.pos = pos + 1
                    items = self.pop_mark()
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
            if handler is stop_step:
                return self.pop()
            handler(self)
        # A fast-path opcode whose argument runs past the end: let its handler report it.
        self.pos += 1
        OPCODES[data[self.pos - 1]](self)
        raise AssertionError("unreachable")



_U32 = struct.Struct("<I")
_INLINE = frozenset({0x71, 0x72, 0x94, 0x68, 0x6A, 0x58, 0x8C, 0x4B, 0x74, 0x29, 0x89, 0x85, 0x86, 0x87})


def load_at(
    data: bytes | memoryview,
    start: int = 0,
    *,
    resolve: Resolver = no_handler,
    persistent_load: Callable[[Any], Any] = refuse_persistent,
    limits: Limits = Limits(),
) -> tuple[Any, int]:
    """Interprets the one pickle starting at ``start``; returns its inert value and where it ends."""
    unpickler = SafeUnpickler(data, resolve=resolve, persistent_load=persistent_load, limits=limits)
    unpickler.pos = start
    return unpickler.load(), unpickler.pos
