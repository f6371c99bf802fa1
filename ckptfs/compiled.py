"""The optional compiled libraries (plain C with no Python.h, built by ``pip install`` when a C compiler is there)
found beside their module and loaded with ctypes, each with an environment switch that leaves it unloaded."""

from __future__ import annotations

import ctypes
import importlib.machinery
import os
from pathlib import Path


def load_extension(directory: Path, stem: str, switch: str, what: str,
                   symbols: tuple[str, ...] = ()) -> tuple[ctypes.CDLL | None, str]:
    """The library ``<stem><extension suffix>`` in ``directory`` and its file's name, or None and why it is not
    loaded, worded for ``--version`` with ``what`` the library is to its caller: ``switch`` set to 0, it does not
    load (or lacks one of ``symbols``: a build older than its module), or it was not built."""
    if os.environ.get(switch, "1") == "0":
        return None, f"{switch}=0"
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = directory / (stem + suffix)
        if path.is_file():
            try:
                library = ctypes.CDLL(str(path))
                for symbol in symbols:
                    getattr(library, symbol)
            except (OSError, AttributeError) as exc:
                return None, f"the compiled {what} does not load: {exc}"
            return library, path.name
    return None, f"no compiled {what} was built"
