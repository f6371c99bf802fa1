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

import os
import struct
from typing import Any, Callable

from ckptfs.errors import CkptfsError, LimitExceededError, TruncatedPickleError, UnpicklingError
from ckptfs.limits import Limits
from ckptfs.pickle import dcp_record, tensor_record
from ckptfs.pickle.machine import Machine, no_handler, refuse_persistent
from ckptfs.pickle.opcodes import OPCODES, append_items, set_items
from ckptfs.pickle.opcodes import stop as stop_step
from ckptfs.pickle.scalars import unicode_text
from ckptfs.pickle.values import UNBUILT, Buildable, FastPathRefused, PickledObject, Resolver, Row, hashable_key

FAST_PATHS = os.environ.get("CKPTFS_PICKLE_FAST_PATHS", "1") != "0"
"""Whether ``load`` runs its inline opcodes and tensor records; off (``CKPTFS_PICKLE_FAST_PATHS=0``, read once at
import) every opcode goes through ``OPCODES``: the reference the fast paths are tested against."""


class SafeUnpickler(Machine):
    dcp_items = False
    """Whether DCP ``.metadata`` items become rows (``dcp_record``; ``load_dcp`` sets it), instead of tensor
    records."""

    def load(self) -> Any:
        """Runs the opcodes from ``pos`` to STOP and returns the inert value.

        One long loop on purpose: the opcodes of a torch state dict and of
        dataclass pickles (memo, strings, small ints, tuples, dicts, NEWOBJ,
        BUILD) are handled inline, two runs of six common in dataclass pickles
        each in one step, and the ~28 opcodes of each tensor record in one
        step (``tensor_record``); a call per opcode would double the cost of
        opening a checkpoint. Each inline opcode does what its ``OPCODES``
        step does, checks and messages in the same order; every other opcode,
        and an inline one whose argument runs past the end, goes through the
        table.
        """
        if not FAST_PATHS:
            return run_steps(self)
        data = self.data
        end = len(data)
        memo = self.memo
        max_memo = self.limits.max_memo_entries
        max_depth = self.limits.max_stack_depth
        metastack = self.metastack
        unpack_u32 = _U32.unpack_from
        unpack_i32 = _I32.unpack_from
        dcp = self.dcp_items
        record_match = _no_match if dcp else tensor_record.PATTERN.match
        dcp_tensor, dcp_storage = dcp_record.apply_tensor, dcp_record.apply_storage
        pickled_object = PickledObject
        buildable = Buildable
        stack = self.stack
        while True:
            pos = self.pos
            if pos >= end:
                raise TruncatedPickleError("pickle truncated: no STOP opcode")
            op = data[pos]
            if op == 0x94 or op == 0x71 or op == 0x72:  # MEMOIZE, BINPUT, LONG_BINPUT
                if op == 0x94:
                    index = len(memo)
                    self.pos = pos + 1
                elif op == 0x71:
                    if pos + 2 > end:
                        break
                    index = data[pos + 1]
                    self.pos = pos + 2
                else:
                    if pos + 5 > end:
                        break
                    index = unpack_u32(data, pos + 1)[0]
                    self.pos = pos + 5
                if not stack:
                    raise UnpicklingError(f"stack underflow at offset {self.pos - 1}")
                if index not in memo and len(memo) >= max_memo:
                    raise LimitExceededError(f"pickle memo exceeds {max_memo} entries (limit max_memo_entries)")
                if dcp:
                    if index != len(memo):
                        self.memo_rewritten = True
                    if isinstance(stack[-1], Row):
                        raise FastPathRefused
                memo[index] = stack[-1]
                continue
            if op == 0x68 or op == 0x6A:  # BINGET, LONG_BINGET
                if dcp and data[pos + (2 if op == 0x68 else 5) : pos + (3 if op == 0x68 else 6)] == b")" \
                        and dcp_storage(self, data, pos):
                    continue
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
                    value = memo[index]
                except KeyError:
                    raise UnpicklingError(f"memo key {index} not found at offset {self.pos}") from None
                if value is UNBUILT:
                    raise FastPathRefused
                if len(stack) >= max_depth:
                    raise _too_deep(max_depth)
                stack.append(value)
                continue
            if op == 0x8C or op == 0x58:  # SHORT_BINUNICODE, BINUNICODE
                if dcp and op == 0x8C and dcp_tensor(self, data, pos):
                    continue
                if op == 0x8C:
                    if pos + 2 > end:
                        break
                    start = pos + 2
                    stop = start + data[pos + 1]
                else:
                    if pos + 5 > end:
                        break
                    start = pos + 5
                    stop = start + unpack_u32(data, pos + 1)[0]
                if stop > end:
                    break
                self.pos = stop
                value = unicode_text(data[start:stop], self, "utf-8")
                if len(stack) >= max_depth:
                    raise _too_deep(max_depth)
                stack.append(value)
                continue
            if op == 0x4B or op == 0x4D or op == 0x4A:  # BININT1, BININT2, BININT: the argument, then the push
                width = 2 if op == 0x4B else 3 if op == 0x4D else 5
                if pos + width > end:
                    break
                if len(stack) >= max_depth:
                    raise _too_deep(max_depth)
                if op == 0x4B:
                    stack.append(data[pos + 1])
                elif op == 0x4D:
                    stack.append(data[pos + 1] | data[pos + 2] << 8)
                else:
                    stack.append(unpack_i32(data, pos + 1)[0])
                self.pos = pos + width
                continue
            if (op == 0x29 and data.startswith(_NEW_OBJECT, pos) and stack and len(stack) < max_depth
                    and len(metastack) < max_depth and len(memo) + 2 <= max_memo):
                # A dataclass's object made and its attribute dict opened, when none of the six steps' checks
                # can fail: the steps' effects in their order.
                self.pos = pos + 2
                made = self.call(stack[-1], ())
                stack[-1] = made
                memo[len(memo)] = made
                attributes: dict[Any, Any] = {}
                stack.append(attributes)
                memo[len(memo)] = attributes
                metastack.append(stack)
                stack = self.stack = []
                self.pos = pos + len(_NEW_OBJECT)
                continue
            if op == 0x86 and data.startswith(_CALL_ON_PAIR, pos) and len(stack) >= 3 and len(memo) + 3 <= max_memo:
                # A call on one pair (``torch.Size((a, b))``), when none of the six steps' checks can fail.
                pair = (stack[-2], stack[-1])
                del stack[-2:]
                memo[len(memo)] = pair
                pair_args = (pair,)  # its own name: the inline NEWOBJ/REDUCE's ``args`` may be anything
                memo[len(memo)] = pair_args
                self.pos = pos + 5
                made = self.call(stack[-1], pair_args)
                stack[-1] = made
                memo[len(memo)] = made
                self.pos = pos + len(_CALL_ON_PAIR)
                continue
            if op in _CONSTANTS:
                if len(stack) >= max_depth:
                    raise _too_deep(max_depth)
                self.pos = pos + 1
                if op == 0x29:  # EMPTY_TUPLE
                    stack.append(())
                elif op == 0x7D:  # EMPTY_DICT
                    stack.append({})
                elif op == 0x89:  # NEWFALSE
                    stack.append(False)
                elif op == 0x5D:  # EMPTY_LIST
                    stack.append([])
                elif op == 0x4E:  # NONE
                    stack.append(None)
                else:  # NEWTRUE
                    stack.append(True)
                continue
            if op == 0x74:  # TUPLE: the items above the MARK, pushed where the MARK was
                self.pos = pos + 1
                if not metastack:
                    raise UnpicklingError(f"no MARK on the stack at offset {pos}")
                made = tuple(stack)
                stack = self.stack = metastack.pop()
                if len(stack) >= max_depth:
                    raise _too_deep(max_depth)
                stack.append(made)
                continue
            if 0x85 <= op <= 0x87:  # TUPLE1, TUPLE2, TUPLE3: pop n, push one (no depth check can fail)
                n = op - 0x84
                if len(stack) < n:
                    raise UnpicklingError(f"stack underflow at offset {pos}")
                made = tuple(stack[-n:])
                del stack[-n:]
                stack.append(made)
                self.pos = pos + 1
                continue
            if op == 0x81 or op == 0x52:  # NEWOBJ, REDUCE: pops two, pushes one (no depth check can fail)
                self.pos = pos + 1
                if len(stack) < 2:
                    raise UnpicklingError(f"stack underflow at offset {pos}")
                args = stack.pop()
                stack[-1] = self.call(stack[-1], args)
                continue
            if op == 0x62:  # BUILD
                self.pos = pos + 1
                if len(stack) < 2:
                    raise UnpicklingError(f"stack underflow at offset {pos}")
                state = stack.pop()
                target = stack[-1]
                if isinstance(target, pickled_object):
                    if target.state is None:
                        target.state = state
                    elif target.later_states is None:
                        target.later_states = [state]
                    else:
                        target.later_states.append(state)
                elif isinstance(target, buildable):
                    target.apply_state(state)
                elif dcp and isinstance(target, Row):
                    raise FastPathRefused
                continue
            if op == 0x75 or op == 0x65:  # SETITEMS, APPENDS
                self.pos = pos + 1
                if not metastack:
                    raise UnpicklingError(f"no MARK on the stack at offset {pos}")
                items = stack
                stack = self.stack = metastack.pop()
                if op == 0x75 and len(items) % 2:
                    raise UnpicklingError("SETITEMS with an odd number of items")
                if not stack:
                    raise UnpicklingError(f"stack underflow at offset {pos}")
                target = stack[-1]
                if op == 0x65:
                    append_items(target, items)
                elif type(target) is dict:
                    for i in range(0, len(items), 2):
                        key = items[i]
                        target[key if type(key) is str else hashable_key(key)] = items[i + 1]
                else:
                    set_items(target, list(zip(items[0::2], items[1::2])))
                continue
            if op == 0x28:  # MARK: perhaps the start of a tensor record (two MARKs)
                if pos + 1 < end and data[pos + 1] == 0x28:
                    record = record_match(data, pos)
                    if record is not None and tensor_record.apply(self, record):
                        continue
                if len(metastack) >= max_depth:
                    raise LimitExceededError(
                        f"pickle nests more than {max_depth} MARKs (limit max_stack_depth)")
                metastack.append(stack)
                stack = self.stack = []
                self.pos = pos + 1
                continue
            self.pos = pos + 1
            handler = OPCODES.get(op)
            if handler is None:
                raise UnpicklingError(f"unknown or refused opcode 0x{op:02x} at offset {pos}")
            if handler is stop_step:
                return self.pop()
            handler(self)
            stack = self.stack
        # An inline opcode whose argument runs past the end: its step reports it.
        self.pos += 1
        OPCODES[data[self.pos - 1]](self)
        raise AssertionError("unreachable")


def load_dcp(data: bytes, limits: Limits) -> Any:
    """A DCP ``.metadata`` pickle's value, its tensor and storage items as ``dcp_record`` rows where they have
    torch's form. What the rows cannot stand for makes the reference path parse it again, and its value or
    error is the answer: ``FastPathRefused``, a row anywhere but its item's place (``dcp_record.in_place``), or
    any error once a row is made (an opcode's message may name a row's type, or one may fail on a row where it
    would not on the object)."""
    if FAST_PATHS:
        done, value = _load_rows(data, limits)
        if done:
            return value
    return SafeUnpickler(data, limits=limits).load()


def _load_rows(data: bytes, limits: Limits) -> tuple[bool, Any]:
    """``load_dcp``'s fast attempt, in a call of its own so that nothing of it is held while the reference runs."""
    unpickler = SafeUnpickler(data, limits=limits)
    unpickler.dcp_items = True
    try:
        root = unpickler.load()
    except FastPathRefused:
        return False, None
    except CkptfsError:
        if unpickler.dcp_tensor_rows or unpickler.dcp_storage_rows:
            return False, None
        raise
    return (True, root) if dcp_record.in_place(unpickler, root) else (False, None)


def _no_match(data: bytes, pos: int) -> None:
    return None


def run_steps(u: Machine) -> Any:
    """The reference interpreter: every opcode through its ``OPCODES`` step, no inline code, no tensor records."""
    data = u.data
    while True:
        if u.pos >= len(data):
            raise TruncatedPickleError("pickle truncated: no STOP opcode")
        op = data[u.pos]
        u.pos += 1
        handler = OPCODES.get(op)
        if handler is None:
            raise UnpicklingError(f"unknown or refused opcode 0x{op:02x} at offset {u.pos - 1}")
        if handler is stop_step:
            return u.pop()
        handler(u)


_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_NEW_OBJECT = b")\x81\x94}\x94("
"""EMPTY_TUPLE NEWOBJ MEMOIZE EMPTY_DICT MEMOIZE MARK: how pickle protocol 4 starts a dataclass (DCP .metadata)."""
_CALL_ON_PAIR = b"\x86\x94\x85\x94R\x94"
"""TUPLE2 MEMOIZE TUPLE1 MEMOIZE REDUCE MEMOIZE."""
_CONSTANTS = frozenset({0x29, 0x7D, 0x89, 0x5D, 0x4E, 0x88})


def _too_deep(max_depth: int) -> LimitExceededError:
    return LimitExceededError(f"pickle stack exceeds {max_depth} entries (limit max_stack_depth)")


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
