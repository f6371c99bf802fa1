"""The state of a restricted pickle interpreter and the steps every opcode is made of.

Reads are bounds-checked, the stack and memo are capped by ``Limits``, a
``GLOBAL`` is only a name, and a call is handed to ``resolve`` (ckptfs' own
handlers for known names) or becomes an inert ``PickledObject``.
"""

from __future__ import annotations

from typing import Any, Callable

from ckptfs.errors import LimitExceededError, TruncatedPickleError, UnpicklingError
from ckptfs.limits import Limits
from ckptfs.pickle.values import UNBUILT, FastPathRefused, Global, Handler, PickledObject, Resolver, Row, short_repr

_RENAMED_MODULES = {"__builtin__": "builtins", "copy_reg": "copyreg", "exceptions": "builtins"}
MAX_LONG_BYTES = 1785
"""Largest LONG4 integer read: 1785 bytes stay under Python's 4300-digit int/str conversion limit."""


MAX_CACHED_HANDLERS = 64


def no_handler(_: Global) -> Handler | None:
    return None


def refuse_persistent(pid: Any) -> Any:
    raise UnpicklingError(f"persistent id {short_repr(pid)} where none is expected")


class Machine:
    """The interpreter's state (input, position, stack, MARKs, memo) and the operations opcodes share.

    ``resolve`` must answer by the name alone: its answers are kept per name.
    """

    def __init__(
        self,
        data: bytes | memoryview,
        *,
        resolve: Resolver = no_handler,
        persistent_load: Callable[[Any], Any] = refuse_persistent,
        limits: Limits = Limits(),
    ) -> None:
        if len(data) > limits.max_pickle_bytes:
            raise LimitExceededError(
                f"pickle of {len(data)} bytes exceeds the limit of {limits.max_pickle_bytes} bytes "
                "(limit max_pickle_bytes)")
        self.data = bytes(data)
        self.pos = 0
        self.resolve = resolve
        self.persistent_load = persistent_load
        self.limits = limits
        self.memo: dict[int, Any] = {}
        self.memo_rewritten = False
        """Whether a put has written other than the next slot: the DCP items (``dcp_record``) need a memo that only
        grows."""
        self.dcp_checked: set[tuple[bytes, ...]] = set()
        self.dcp_values: dict[bytes, Any] = {}
        self.dcp_tensor_rows = 0
        self.dcp_storage_rows = 0
        self.stack: list[Any] = []
        self.metastack: list[list[Any]] = []
        self.proto = 0
        self.handlers: dict[int, tuple[Global, Handler | None]] = {}
        """``resolve``'s answers by the identity of the name asked about (held, so the identity stays its own)."""

    # -- reading primitives -------------------------------------------------

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise TruncatedPickleError(
                f"pickle truncated: needs {n} bytes at offset {self.pos}, "
                f"{len(self.data) - self.pos} remain"
            )
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def read_line(self) -> bytes:
        end = self.data.find(b"\n", self.pos)
        if end < 0:
            raise TruncatedPickleError(f"pickle truncated: unterminated line at offset {self.pos}")
        line = self.data[self.pos : end]
        self.pos = end + 1
        return line

    def u8(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return int.from_bytes(self.take(2), "little")

    def u32(self) -> int:
        return int.from_bytes(self.take(4), "little")

    def u64(self) -> int:
        return int.from_bytes(self.take(8), "little")

    # -- stack helpers -------------------------------------------------------

    def push(self, value: Any) -> None:
        if len(self.stack) >= self.limits.max_stack_depth:
            raise LimitExceededError(
                f"pickle stack exceeds {self.limits.max_stack_depth} entries (limit max_stack_depth)")
        self.stack.append(value)

    def pop(self) -> Any:
        if not self.stack:
            raise UnpicklingError(f"stack underflow at offset {self.pos - 1}")
        return self.stack.pop()

    def top(self) -> Any:
        if not self.stack:
            raise UnpicklingError(f"stack underflow at offset {self.pos - 1}")
        return self.stack[-1]

    def pop_mark(self) -> list[Any]:
        if not self.metastack:
            raise UnpicklingError(f"no MARK on the stack at offset {self.pos - 1}")
        items = self.stack
        self.stack = self.metastack.pop()
        return items

    def memo_put(self, index: int, value: Any) -> None:
        if index not in self.memo and len(self.memo) >= self.limits.max_memo_entries:
            raise LimitExceededError(
                f"pickle memo exceeds {self.limits.max_memo_entries} entries (limit max_memo_entries)")
        if index != len(self.memo):
            self.memo_rewritten = True
        if isinstance(value, Row):
            raise FastPathRefused
        self.memo[index] = value

    def memo_get(self, index: int) -> Any:
        try:
            value = self.memo[index]
        except KeyError:
            raise UnpicklingError(f"memo key {index} not found at offset {self.pos}") from None
        if value is UNBUILT:
            raise FastPathRefused
        return value

    # -- semantic helpers ----------------------------------------------------

    def find_global(self, module: str, name: str) -> Global:
        return Global(_RENAMED_MODULES.get(module, module), name)

    def call(self, func: Any, args: Any, kwargs: Any = None) -> Any:
        if not isinstance(args, tuple):
            args = (args,) if not isinstance(args, list) else tuple(args)
        if isinstance(func, Global) and kwargs is None:
            # A pickle names its few callables once and calls them through the memo: look each up once.
            known = self.handlers.get(id(func))
            if known is not None and known[0] is func:
                handler = known[1]
            else:
                handler = self.resolve(func)
                if len(self.handlers) < MAX_CACHED_HANDLERS:
                    self.handlers[id(func)] = (func, handler)
            if handler is not None:
                try:
                    return handler(args)
                except (TypeError, ValueError, OverflowError) as exc:
                    raise UnpicklingError(f"bad arguments to {func.qualname}: {exc}") from None
        return PickledObject(func, args, kwargs)

    def decode_str(self, raw: bytes) -> str | bytes:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw
