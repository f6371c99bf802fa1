"""A whole pickled ``nn.Module`` (``torch.save(model)``) seen as its ``state_dict()``.

torch names a module's state module by module, depth first: its own
``_parameters``, then its ``_buffers`` less those in
``_non_persistent_buffers_set``, then each child of ``_modules`` with the
child's name and a dot before its keys; entries that are None are left out
(and names that are no str, which torch never makes).
A module shared by two parents is named under both, as torch does, and a tensor
tied to several names is one record under each.
"""

from __future__ import annotations

from typing import Any

from ckptfs.errors import LimitExceededError
from ckptfs.limits import Limits
from ckptfs.model.records import Tensor, replace
from ckptfs.model.tree import children
from ckptfs.pickle.values import PickledObject

MODULE_ATTRIBUTES = ("_parameters", "_buffers", "_modules")


def _attributes(value: Any) -> dict[Any, Any] | None:
    """A module's attributes, or None for anything that is no pickled ``nn.Module``."""
    if not isinstance(value, PickledObject):
        return None
    attributes = dict(children(value))
    if not all(isinstance(attributes.get(name), dict) for name in MODULE_ATTRIBUTES):
        return None
    return attributes


def state_dict(root: Any, limits: Limits = Limits()) -> dict[str, Tensor] | None:
    """``root``'s ``state_dict()`` as torch would name it (copies of its tensor records, a tied tensor one copy),
    or None when ``root`` is no pickled ``nn.Module``. Values that are no tensors (an ``_extra_state``) are left
    out. Modules shared or cyclic are named again at each place, so the names are bounded as a tree is: more
    than ``max_tree_nodes`` entries visited, ``max_tensors`` names, ``max_key_bytes`` of names or modules
    nesting deeper than ``max_tree_depth`` are refused."""
    attributes = _attributes(root)
    if attributes is None:
        return None
    found: dict[str, Tensor] = {}
    copies: dict[int, Tensor] = {}
    visited = 0
    name_bytes = 0
    stack: list[tuple[str, dict[Any, Any], int]] = [("", attributes, 0)]
    while stack:
        prefix, module, depth = stack.pop()
        skipped = module.get("_non_persistent_buffers_set")
        non_persistent = skipped if isinstance(skipped, (set, frozenset)) else set()
        named = [*module["_parameters"].items(),
                 *((name, value) for name, value in module["_buffers"].items() if name not in non_persistent)]
        for name, value in named:
            visited += 1
            if isinstance(value, Tensor) and type(name) is str:
                copy = copies.get(id(value))
                if copy is None:
                    copy = copies[id(value)] = replace(value, trail=None)
                key = f"{prefix}{name}"
                found[key] = copy
                name_bytes += len(key)
        below: list[tuple[str, dict[Any, Any], int]] = []
        for name, child in module["_modules"].items():
            visited += 1
            child_attributes = _attributes(child)
            if child_attributes is not None and type(name) is str:
                if len(prefix) + len(name) >= limits.max_key_bytes:
                    raise LimitExceededError(f"a module's name exceeds {limits.max_key_bytes} bytes "
                                             "(limit max_key_bytes)")
                below.append((f"{prefix}{name}.", child_attributes, depth + 1))
        if len(found) > limits.max_tensors:
            raise LimitExceededError(f"the module's state dict names more than {limits.max_tensors} tensors "
                                     "(limit max_tensors)")
        if name_bytes > limits.max_key_bytes:
            raise LimitExceededError(f"the module's state dict names exceed {limits.max_key_bytes} bytes "
                                     "(limit max_key_bytes)")
        if visited > limits.max_tree_nodes:
            raise LimitExceededError(f"the module's state dict has more than {limits.max_tree_nodes} entries "
                                     "(limit max_tree_nodes)")
        if below and depth + 1 > limits.max_tree_depth:
            raise LimitExceededError(f"modules nest deeper than {limits.max_tree_depth} (limit max_tree_depth)")
        stack.extend(reversed(below))
    return found
