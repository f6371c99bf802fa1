"""Checkpoints of particular shapes that tests of several layers make: bombs, long paths, inert objects."""

from __future__ import annotations

import decimal
import enum
import sys
import types
from pathlib import Path
from typing import Any

from hostile.cases import FLOATS
from hostile.containers import zip_checkpoint
from hostile.picklegen import (
    EMPTY_DICT,
    LIST,
    MARK,
    POP,
    SETITEM,
    call,
    get,
    glob,
    i,
    ints,
    pickle,
    put,
    s,
    storage_pid,
    tensor_v2,
)

LS_LA = pickle(call(glob("posix", "system"), s("ls -la")))
"""What ``os.system('ls -la')`` pickles to on Linux: a REDUCE of ``posix.system``."""


def dag_bomb(levels: int) -> bytes:
    """A list ``x = [x, x]`` nested ``levels`` deep over a list holding one tensor: 2**levels tensor paths."""
    body = MARK + tensor_v2(storage_pid("FloatStorage", "0", 2), i(0), ints(2), ints(1)) + LIST + put(0) + POP
    for level in range(1, levels + 1):
        body += MARK + get(level - 1) + get(level - 1) + LIST + put(level) + (POP if level < levels else b"")
    return pickle(body)


def long_paths(path: Path, key_length: int = 200) -> Path:
    """One tensor 31 dicts deep, every key the same str: a 31-key path, 6 KB of text for 200 characters a key."""
    data = zip_checkpoint(pickle(
        EMPTY_DICT + s("k" * key_length) + put(0)
        + b"".join(EMPTY_DICT + get(0) for _ in range(30))
        + tensor_v2(storage_pid("FloatStorage", "0", 4), i(0), ints(4), ints(1))
        + SETITEM * 31), {"0": FLOATS})
    path.write_bytes(data)
    return path


class OmegaconfLikeNode:
    """Like omegaconf's nodes and containers: no ``__reduce__``; ``__getstate__`` gives ``__dict__``."""

    def __init__(self, **attributes: Any) -> None:
        self.__dict__.update(attributes)


def fake_omegaconf_classes(monkeypatch: Any) -> dict[str, type]:
    """Classes named as omegaconf's (``omegaconf.nodes.AnyNode`` …), and an app's enum, that pickle finds by name."""
    classes: dict[str, type] = {}
    modules = {"omegaconf": [], "omegaconf.dictconfig": ["DictConfig"], "omegaconf.base": ["ContainerMetadata",
               "Metadata"], "omegaconf.nodes": ["AnyNode", "EnumNode", "StringNode"], "myapp": [], "myapp.config": []}
    for module_name, names in modules.items():
        module = types.ModuleType(module_name)
        monkeypatch.setitem(sys.modules, module_name, module)
        for name in names:
            classes[name] = type(name, (OmegaconfLikeNode,), {"__module__": module_name, "__qualname__": name})
            setattr(module, name, classes[name])
    classes["Color"] = enum.Enum("Color", {"RED": "red"}, module="myapp.config", qualname="Color")  # type: ignore[misc]
    # Pickled as ``Color('red')`` whatever the Python: 3.11.2 would write ``getattr(Color, 'RED')`` instead.
    classes["Color"].__reduce_ex__ = lambda member, protocol: (type(member), (member.value,))
    sys.modules["myapp.config"].Color = classes["Color"]  # type: ignore[attr-defined]
    return classes


def omegaconf_like(classes: dict[str, type]) -> Any:
    meta = classes["Metadata"]
    content = {
        "lr": classes["AnyNode"](_val=0.001, _metadata=meta(ref_type=Any, key="lr", optional=True), _parent=None),
        "name": classes["StringNode"](_val="run-7", _metadata=meta(ref_type=str, key="name", optional=True),
                                      _parent=None),
        "color": classes["EnumNode"](_val=classes["Color"]("red"), _parent=None,
                                     _metadata=meta(ref_type=classes["Color"], key="color", optional=False)),
        "budget": classes["AnyNode"](_val=decimal.Decimal("0.1"), _metadata=meta(ref_type=Any, key="budget",
                                                                                optional=True), _parent=None),
    }
    return classes["DictConfig"](_metadata=classes["ContainerMetadata"](ref_type=Any, object_type=dict, key=None,
                                                                         flags={"readonly": True}),
                                 _parent=None, _content=content)
