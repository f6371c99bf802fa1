"""TorchScript archives: which module attributes are parameters.

The pickles of ``torch.jit.save`` do not say which tensors are parameters; each
class's code record declares them (``__parameters__ = ["weight", "bias", ]``,
spec §4.3). The code is read as text and never run.
"""

from __future__ import annotations

import re
from typing import Any

from ckptfs.formats.zip_archive import ZipArchive, check_inflation
from ckptfs.limits import Limits
from ckptfs.model.records import Tensor
from ckptfs.model.tree import walk
from ckptfs.pickle.values import Global, PickledObject

_CLASS = re.compile(r"class (\w+)\(")
_PARAMETERS = re.compile(r"\s+__parameters__ = \[(.*)\]\s*$")
_NAME = re.compile(r'"(\w+)"')


def mark_parameters(archive: ZipArchive, root: Any, limits: Limits) -> None:
    """Sets ``is_parameter`` on the tensors each scripted module declares as parameters."""
    modules = [
        visit.value
        for visit in walk(root, limits)
        if visit.first and isinstance(visit.value, PickledObject) and isinstance(visit.value.callable, Global)
        and visit.value.callable.module.startswith("__torch__") and isinstance(visit.value.state, dict)
    ]
    records = {_code_record(m.callable) for m in modules}
    for record in records:
        if (entry := archive.entry(record)) is not None:
            check_inflation(entry, limits)
    declared: dict[tuple[str, str], list[str]] = {}
    for record, code in archive.read_records(dict.fromkeys(records, limits.max_pickle_bytes)).items():
        module = record.removeprefix("code/").removesuffix(".py").replace("/", ".")
        for class_name, names in _declared_parameters(code.decode("utf-8", "replace")):
            declared[(module, class_name)] = names
    for m in modules:
        for name in declared.get((m.callable.module, m.callable.name), ()):
            tensor = m.state.get(name)
            if isinstance(tensor, Tensor):
                tensor.is_parameter = True


def _code_record(cls: Global) -> str:
    return "code/" + cls.module.replace(".", "/") + ".py"


def _declared_parameters(code: str) -> list[tuple[str, list[str]]]:
    found: list[tuple[str, list[str]]] = []
    current: str | None = None
    for line in code.splitlines():
        if (cls := _CLASS.match(line)) is not None:
            current = cls.group(1)
        elif current is not None and (params := _PARAMETERS.match(line)) is not None:
            found.append((current, _NAME.findall(params.group(1))))
    return found
