"""A listing window's entries added to a readdir reply buffer (``fuse_add_direntry`` or ``_plus`` for each),
by the loop in C of ``_cdirents.c`` when it is built, else by the same loop in Python: a first listing of 600,000
entries makes 600,000 calls, each a ctypes call from Python.
"""

from __future__ import annotations

import array
import ctypes
import sys
from pathlib import Path
from typing import Any, TypeAlias

from ckptfs.compiled import load_extension

_HERE = Path(__file__).parent


def _load() -> tuple[Any, str]:
    """``cd_add_entries`` and how ``--version`` names the loop: why it is not used when it is not."""
    library, found = load_extension(_HERE, "_cdirents", "CKPTFS_DIRENTS_COMPILED", "loop", ("cd_add_entries",))
    if library is None:
        return None, f"Python ({found})"
    function = library.cd_add_entries
    function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t,
                         ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64, ctypes.c_int64,
                         ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)]
    function.restype = ctypes.c_size_t
    return function, f"compiled ({found})"


COMPILED, PATH_NAME = _load()
Column: TypeAlias = "list[int] | array.array[int]"
"""A window's values of one field of its entries' attributes."""


def numpy_loaded() -> bool:
    """Whether numpy is imported already (a mount from the metadata cache decoded its entry with it): big listings'
    windows are then made with it. A mount that parsed its checkpoint lists without it: its import would add
    ~10 MB to the daemon's memory and ~40 ms to the first listing, more than it saves there."""
    return "numpy" in sys.modules


def blocks(sizes: array.array[int], bulk: bool) -> Column:
    """Each size's 512-byte blocks (``st_blocks``); with numpy when ``bulk`` (``numpy_loaded``)."""
    if not bulk or not sizes:
        return [(n + 511) >> 9 for n in sizes]
    import numpy as np  # here: a command line that lists no big directory starts without it

    # Sizes are 0 to MAX_FILE_SIZE: unsigned, as their sum with 511 may not fit an int64.
    found = np.frombuffer(sizes, dtype=f"u{sizes.itemsize}").astype(np.uint64)
    return array.array("Q", ((found + np.uint64(511)) >> np.uint64(9)).tobytes())


_CODES = {2: "H", 4: "I", 8: "Q"}


def write_column(view: memoryview, offset: int, size: int, stride: int, values: Column) -> None:
    """Writes ``values[i]`` into the field of ``size`` bytes at ``offset`` of the i-th record of ``stride`` bytes in
    ``view`` (a window's ``struct stat``s or ``fuse_entry_param``s): a column at a time."""
    code = _CODES[size]
    column = values if isinstance(values, array.array) and values.typecode == code else array.array(code, values)
    view.cast(code)[offset // size :: stride // size] = column


class Names:
    """A window's names, encoded as a loop takes them: one at a time (``names``) or, for the compiled loop, all
    joined (``text``), each made on first use."""

    __slots__ = ("texts", "count", "_names", "_text")

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self.count = len(texts)
        self._names: list[bytes] | None = None
        self._text: bytes | None = b""
        """b"": not made yet (a made text holds a NUL at least)."""

    @property
    def names(self) -> list[bytes]:
        """Each name's UTF-8 bytes: for the Python loop and the high-level API's filler (``-o rw``)."""
        if self._names is None:
            self._names = [text.encode("utf-8") for text in self.texts]
        return self._names

    @property
    def text(self) -> bytes | None:
        """The names each NUL-terminated one after another, encoded at once: only the low-level lister's
        ``add_entries`` takes them. None when a name holds a NUL: the Python loop then adds them, as C would read
        such a name cut short."""
        if self._text == b"":
            text = ("\0".join(self.texts) + "\0").encode("utf-8")
            self._text = text if text.count(0) == self.count else None
        return self._text


def add_entries(add: Any, req: int, buf: int, size: int, used: int, names: Names, entries: int, stride: int,
                start: int, first: int) -> tuple[int, int]:
    """Adds entries from ``first`` on with ``add`` (libfuse's function) until the buffer is full: the bytes taken
    in all, and the first entry not added (``names.count`` when all were)."""
    if COMPILED is not None and names.text is not None:
        next_entry = ctypes.c_int64()
        used = COMPILED(ctypes.cast(add, ctypes.c_void_p), req, buf, size, used, names.text, entries, stride, start,
                        first, names.count, ctypes.byref(next_entry))
        return used, next_entry.value
    return _add_entries(add, req, buf, size, used, names, entries, stride, start, first)


def _add_entries(add: Any, req: int, buf: int, size: int, used: int, names: Names, entries: int, stride: int,
                 start: int, first: int) -> tuple[int, int]:
    """``cd_add_entries`` in Python: the reference and the fallback."""
    listed = names.names
    for index in range(first, names.count):
        need = add(req, buf + used, size - used, listed[index], entries + index * stride, start + index + 1)
        if need > size - used:
            return used, index
        used += need
    return used, names.count
