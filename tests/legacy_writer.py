"""torch's legacy writer (``_use_new_zipfile_serialization=False``), made byte-reproducible for fixtures.

torch names each storage of a legacy file by its memory address (``str(storage._cdata)``) and
writes the storages in the sorted order of those names, so the bytes of the file, and its size,
change from run to run (and more under some interpreters than others). ``save_legacy_reproducibly`` runs
torch's own writer with a pickle module that renames every storage, as the pickler meets it, to a
fixed address-like key, then puts the storages in the sorted order of the new keys, as torch
would have. The keys count down, so that, as in most real files, the storages are not stored in
the order the pickle names them.
"""

from __future__ import annotations

import io
import pickle
import struct
import types
import warnings
from pathlib import Path
from typing import Any

import torch

KEY_BASE = 94_000_000_000_000
"""The first storage's key: a 14-digit number, as a heap address is."""
KEY_STEP = 4096
COUNT_HEADER = struct.Struct("<q")
"""Each stored storage starts with its element count."""


class _Renaming:
    """One save's storages: torch's key, the key it gets instead, its size; where the storages start."""

    def __init__(self) -> None:
        self.keys: dict[str, str] = {}
        self.nbytes: dict[str, int] = {}
        self.data_start: int | None = None

    def rename(self, key: str, storage: Any) -> str:
        if key not in self.keys:
            self.keys[key] = str(KEY_BASE - KEY_STEP * len(self.keys))
            self.nbytes[key] = storage.nbytes()
        return self.keys[key]

    def module(self) -> types.ModuleType:
        """A pickle module for ``torch.save(pickle_module=...)`` that renames as it pickles."""
        renaming = self

        class Pickler(pickle.Pickler):
            def __init_subclass__(cls, **kwargs: Any) -> None:
                # torch subclasses this with its own persistent_id; ours wraps it.
                super().__init_subclass__(**kwargs)
                torch_persistent_id = cls.persistent_id

                def persistent_id(self: pickle.Pickler, obj: Any) -> Any:
                    pid = torch_persistent_id(self, obj)
                    if isinstance(pid, tuple) and pid[0] == "storage":
                        pid = (*pid[:2], renaming.rename(pid[2], obj), *pid[3:])
                    return pid

                cls.persistent_id = persistent_id

        def dump(obj: Any, file: Any, protocol: int) -> None:
            if renaming.keys and isinstance(obj, list) and sorted(obj) == sorted(renaming.keys):
                pickle.dump(sorted(renaming.keys.values()), file, protocol=protocol)
                renaming.data_start = file.tell()
            else:
                pickle.dump(obj, file, protocol=protocol)

        module = types.ModuleType("legacy_writer_pickle")
        module.Pickler = Pickler  # type: ignore[attr-defined]
        module.dump = dump  # type: ignore[attr-defined]
        return module

    def reorder(self, data: bytes) -> bytes:
        """Storages from torch's order (its keys, sorted) to the sorted order of the new keys."""
        if self.data_start is None:
            return data
        blocks, position = {}, self.data_start
        for key in sorted(self.keys):
            size = COUNT_HEADER.size + self.nbytes[key]
            blocks[self.keys[key]] = data[position : position + size]
            position += size
        assert position == len(data), f"storages end at {position}, the file at {len(data)}"
        return data[: self.data_start] + b"".join(blocks[key] for key in sorted(blocks))


def legacy_bytes(obj: Any, **kwargs: Any) -> bytes:
    """``torch.save(obj, _use_new_zipfile_serialization=False)``'s bytes, with fixed storage keys."""
    renaming = _Renaming()
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.save(obj, buffer, pickle_module=renaming.module(), _use_new_zipfile_serialization=False, **kwargs)
    return renaming.reorder(buffer.getvalue())


def save_legacy_reproducibly(obj: Any, path: Path, **kwargs: Any) -> Path:
    """Writes ``legacy_bytes(obj)`` to ``path`` after checking that torch loads it as it loads its own file."""
    data = legacy_bytes(obj, **kwargs)
    own = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.save(obj, own, _use_new_zipfile_serialization=False, **kwargs)
    assert _loaded(data) == _loaded(own.getvalue()), f"{path}: torch loads the renamed file differently"
    path.write_bytes(data)
    return path


def _loaded(data: bytes) -> bytes | str:
    """What ``torch.load`` makes of a file, as comparable bytes (a zip checkpoint of it), or its error's type."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            loaded = torch.load(io.BytesIO(data), weights_only=False)
        except Exception as exc:  # torch cannot load some legacy files it writes (v3 dtypes, nested tensors)
            return type(exc).__name__
        buffer = io.BytesIO()
        torch.save(loaded, buffer)
    return buffer.getvalue()
